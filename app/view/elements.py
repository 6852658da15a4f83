"""Cytoscape elements for the graph view: the step's nodes, module boxes and edges as plain dicts.

Turning the domain into elements is a pure function (as in dash-cytoscape's own utilities), so a
callback is `cytoscape_elements(wire, layout_graph(wire, collapsed), color_by)`.

Every element has an explicit `group` ("nodes"/"edges"). Element ids: `n12` (node 12),
`m:blocks.3` (a folded module), `g:blocks.3` (the box of an expanded module: a compound parent,
`data.parent` of what is drawn inside it), `e:<source>><target>` (edges).

Classes a stylesheet can select on:
    nodes: the node kind (`op param leaf compiled checkpoint custom hook`), `root` (where backward
    started), `notrun` (did not execute in this step), `collapsed` (a folded module), `module` (a
    box), `nan` (a NaN or Inf in its gradients; `data.badge` says which), `zerograd` (the gradient
    that arrived is all zeros);
    edges: `merged` (stands for several wire edges), `up` (closes a cycle that folding made),
    `bent` (a long edge routed through `data.bend_d` / `data.bend_w`, for the style
    `{"curve-style": "segments", "edge-distances": "node-position", "segment-distances":
    "data(bend_d)", "segment-weights": "data(bend_w)"}`).

A node's source line is `data.line` (never `data.source`: cytoscape reads `source` as an edge's
end). Colour: `data.color` is the chosen statistic of the node's `grad_outputs[0]` (what arrived from
the loss side) through a sequential scale; `legend()` gives the range and ticks.
"""

from __future__ import annotations

import math
from typing import Any

from gradscape.app.view._wire import (
    ACCUMULATE,
    ROOT_MODULE,
    Wire,
    fmt_num,
    fmt_shape,
    max_abs,
    module_type,
    node_label,
    node_module,
    nonfinite,
    numel,
    stat,
    tensor,
    zero_fraction,
)
from gradscape.app.view.collapse import BOX_PREFIX, MODULE_PREFIX, box_element, box_label, module_label
from gradscape.tracer.wire import WireNode, WireTensor

COLOR_BY = ("norm", "maxabs", "zeros")
# Viridis (plotly.colors.sequential.Viridis): perceptually uniform, readable when printed grey.
SCALE = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b",
         "#fde725")
MISSING_COLOR = "#d0d0d0"  # no gradient recorded (the node did not run, or the slot was None)
NAN_FILL = "#ff3333"  # a node with a NaN or Inf in its gradients (with a red border)
PAGE_BACKGROUND = "#ffffff"  # behind the graph: where a module box's label sits (above the box)
BOX_FILL = "#2b5d9c"  # a module box, drawn at 6 % opacity
DARK_TEXT, LIGHT_TEXT = "#000000", "#ffffff"
_TITLES = {
    "norm": "‖∂L/∂output‖₂ (log₁₀)",
    "maxabs": "max |∂L/∂output| (log₁₀)",
    "zeros": "fraction of ∂L/∂output that is exactly 0",
}


# ---------------------------------------------------------------------------- colour
def _check(color_by: str) -> None:
    if color_by not in COLOR_BY:
        raise ValueError(f"color_by must be one of {COLOR_BY}, got {color_by!r}")


def statistic(t: WireTensor | None, color_by: str) -> float | None:
    """The raw statistic a node is coloured by (None when there is no tensor)."""
    if t is None:
        return None
    if color_by == "norm":
        return stat(t, "norm")
    if color_by == "maxabs":
        return max_abs(t)
    return zero_fraction(t)


def _scaled(value: float | None, color_by: str) -> float | None:
    """Magnitudes span many decades, so they are coloured by log₁₀; 0 has no logarithm and is
    clamped to the bottom of the scale by the caller (`-inf`)."""
    if value is None or math.isnan(value):
        return None
    if color_by == "zeros":
        return value
    return math.log10(value) if value > 0 else -math.inf


def _range(wire: Wire, color_by: str) -> tuple[float, float]:
    if color_by == "zeros":
        return 0.0, 1.0
    vals = []
    for n in wire["nodes"]:
        s = _scaled(statistic(_arrived(wire, n), color_by), color_by)
        if s is not None and math.isfinite(s):
            vals.append(s)
    if not vals:
        return 0.0, 1.0
    lo, hi = min(vals), max(vals)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    return lo, hi


def color_of(fraction: float | None) -> str:
    """A colour of the sequential scale for a position in [0, 1] (None: the 'missing' grey)."""
    if fraction is None:
        return MISSING_COLOR
    f = min(max(fraction, 0.0), 1.0) * (len(SCALE) - 1)
    i = min(int(f), len(SCALE) - 2)
    t = f - i
    a, b = SCALE[i], SCALE[i + 1]
    rgb = [round(int(a[k:k + 2], 16) * (1 - t) + int(b[k:k + 2], 16) * t) for k in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def luminance(color: str) -> float:
    """WCAG 2 relative luminance of a `#rrggbb` colour."""
    out = 0.0
    for weight, k in ((0.2126, 1), (0.7152, 3), (0.0722, 5)):
        c = int(color[k:k + 2], 16) / 255
        out += weight * (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4)
    return out


def contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two `#rrggbb` colours (1 to 21; AA asks 4.5 for text)."""
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def text_color(fill: str) -> str:
    """Black or white, whichever contrasts more with `fill`: at least 4.58:1 for any fill (the worst
    fill is the one equally far from both, luminance 0.179), so every label passes WCAG AA."""
    return DARK_TEXT if contrast(fill, DARK_TEXT) >= contrast(fill, LIGHT_TEXT) else LIGHT_TEXT


def _tick_label(v: float, color_by: str) -> str:
    if color_by == "zeros":
        return f"{v:.0%}"
    return f"1e{int(v)}" if v == int(v) else f"{10 ** v:.2g}"


def legend(wire: Wire, color_by: str = "norm") -> dict[str, Any]:
    """Range, ticks and gradient of the node colours, for a legend drawn next to the graph.

    The range covers every node of the step (not only the drawn ones), so colours do not change
    meaning when a module is expanded.
    """
    _check(color_by)
    lo, hi = _range(wire, color_by)
    if color_by == "zeros":
        values = [0.0, 0.25, 0.5, 0.75, 1.0]
    else:
        values = [float(d) for d in range(math.ceil(lo), math.floor(hi) + 1)]
        if len(values) < 2:
            values = [lo, hi]
    ticks = [{"value": v, "label": _tick_label(v, color_by), "at": (v - lo) / (hi - lo),
              "color": color_of((v - lo) / (hi - lo))} for v in values]
    stops = [[k / (len(SCALE) - 1), c] for k, c in enumerate(SCALE)]
    return {"color_by": color_by, "title": _TITLES[color_by], "log": color_by != "zeros", "min": lo, "max": hi,
            "min_label": _tick_label(lo, color_by) if color_by == "zeros" else f"{10 ** lo:.2g}",
            "max_label": _tick_label(hi, color_by) if color_by == "zeros" else f"{10 ** hi:.2g}",
            "ticks": ticks, "colorscale": stops, "missing": MISSING_COLOR,
            "css_gradient": "linear-gradient(to right, " + ", ".join(SCALE) + ")"}


def _arrived(wire: Wire, node: WireNode) -> WireTensor | None:
    """grad_outputs[0] of a node: the gradient that arrived from the loss side."""
    go = node["go"] or []
    return tensor(wire, go[0]) if go else None


def _color_fields(value: float | None, color_by: str, lo: float, hi: float) -> dict[str, Any]:
    s = _scaled(value, color_by)
    frac = None if s is None else (0.0 if s == -math.inf else (s - lo) / (hi - lo))
    return {"value": value, "color": color_of(frac), "value_text": "no gradient" if value is None else
            (f"{value:.1%}" if color_by == "zeros" else fmt_num(value))}


# ---------------------------------------------------------------------------- elements
def _badge(tensors: list[WireTensor | None]) -> tuple[int, int]:
    nan = inf = 0
    for t in tensors:
        a, b = nonfinite(t)
        nan += a
        inf += b
    return nan, inf


def _badge_text(nan: int, inf: int) -> str | None:
    parts = (["NaN"] if nan else []) + (["Inf"] if inf else [])
    return "/".join(parts) or None


def _node_tensors(wire: Wire, node: WireNode) -> list[WireTensor | None]:
    return [tensor(wire, i) for i in (node["go"] or []) + (node["gi"] or [])]


def _roots(wire: Wire) -> set[int]:
    roots = {r for p in wire["passes"] for r in p["roots"]}
    if not roots and wire["nodes"]:
        has_in = {dst for _, dst, _ in wire["edges"]}
        roots = {n["id"] for n in wire["nodes"] if n["id"] not in has_in}
    return roots


def _op_element(wire: Wire, node: WireNode, info: dict[str, Any], roots: set[int], color_by: str,
                 lo: float, hi: float) -> dict[str, Any]:
    arrived = _arrived(wire, node)
    nan, inf = _badge(_node_tensors(wire, node))
    classes = [node["kind"] or "op"]
    if node["id"] in roots:
        classes.append("root")
    if node["order"] is None:
        classes.append("notrun")
    if nan or inf:
        classes.append("nan")
    if arrived is not None and numel(arrived["shape"]) and stat(arrived, "zeros") == numel(arrived["shape"]):
        classes.append("zerograd")
    out_shape = arrived["shape"] if arrived is not None else (node["out_shapes"] or [None])[0]
    data: dict[str, Any] = {
        "id": f"n{node['id']}", "node": node["id"], "label": node_label(node, wire), "name": node["name"],
        "kind": node["kind"] or "op", "module": node["module"], "param": node["param"],
        "line": node["source"], "order": node["order"], "shape": fmt_shape(out_shape),
        "badge": _badge_text(nan, inf), "nan": nan, "inf": inf, **_color_fields(statistic(arrived, color_by),
                                                                                color_by, lo, hi),
        "w": info["w"], "h": info["h"],
    }
    _paint(data)
    if info.get("parent"):
        data["parent"] = box_element(info["parent"])
    where = " · ".join(str(p) for p in (node["module"] or node["param"], node["source"]) if p)
    data["title"] = f"{node['name']}" + (f" · {where}" if where else "") + f"\n∂L/∂output {data['shape']}: " + \
        data["value_text"]
    return {"group": "nodes", "data": data, "position": {"x": info["x"], "y": info["y"]},
            "classes": " ".join(classes)}


def _module_element(wire: Wire, eid: str, info: dict[str, Any], color_by: str, lo: float,
                    hi: float) -> dict[str, Any]:
    prefix = eid[len(MODULE_PREFIX):]
    members = info.get("members") or []
    mod = wire["modules"].get(prefix)
    calls = mod["calls"] if mod else []
    go = calls[0]["go"] if calls else []
    arrived = tensor(wire, go[0]) if go else None
    if arrived is not None:
        value = statistic(arrived, color_by)
    else:  # no module-level gradient (never called, or its output needed none): the largest inside
        vals = [v for v in (statistic(_arrived(wire, wire["nodes"][i]), color_by) for i in members) if v is not None]
        value = max(vals) if vals else None
    nan = inf = 0
    for i in members:
        a, b = _badge(_node_tensors(wire, wire["nodes"][i]))
        nan, inf = nan + a, inf + b
    kind = module_type(wire, prefix)
    label = module_label(wire, prefix, len(members))
    data: dict[str, Any] = {"id": eid, "label": label, "module": prefix, "kind": "module", "type": kind,
                            "count": len(members), "badge": _badge_text(nan, inf), "nan": nan, "inf": inf,
                            **_color_fields(value, color_by, lo, hi), "w": info["w"], "h": info["h"]}
    _paint(data)
    if info.get("parent"):
        data["parent"] = box_element(info["parent"])
    data["title"] = label.replace("\n", " · ") + f" (folded; click to expand)\n∂L/∂output: {data['value_text']}"
    classes = ["collapsed"] + (["nan"] if nan or inf else [])
    return {"group": "nodes", "data": data, "position": {"x": info["x"], "y": info["y"]},
            "classes": " ".join(classes)}


def _paint(data: dict[str, Any]) -> None:
    """The fill a node is drawn with (`data.fill`: its colour, or red for NaN/Inf) and the label
    colour that reads on it (`data.text_color`)."""
    data["fill"] = NAN_FILL if data.get("nan") or data.get("inf") else data["color"]
    data["text_color"] = text_color(data["fill"])


def _edge_element(wire: Wire, edge: dict[str, Any], layout_nodes: dict[str, Any]) -> dict[str, Any]:
    slots = edge["slots"]
    labels = []
    for src, _dst, slot in slots[:4]:
        node_labels = wire["nodes"][src].get("labels") or []
        labels.append(node_labels[slot] if slot < len(node_labels) else f"input {slot}")
    sent = []
    for src, _dst, slot in slots:
        gi = wire["nodes"][src].get("gi") or []
        t = tensor(wire, gi[slot]) if slot < len(gi) else None
        if t is not None:
            sent.append(stat(t, "norm") or 0.0)
    data: dict[str, Any] = {"id": edge["id"], "source": edge["source"], "target": edge["target"],
                            "count": len(slots), "label": "; ".join(labels) + (" …" if len(slots) > 4 else ""),
                            "norm": max(sent) if sent else None}
    classes = (["merged"] if len(slots) > 1 else []) + (["up"] if edge.get("up") else [])
    if edge.get("bends"):
        s, t = layout_nodes[edge["source"]], layout_nodes[edge["target"]]
        data["bend_d"], data["bend_w"] = _segments(s["x"], s["y"], t["x"], t["y"], edge["bends"])
        classes.append("bent")
    return {"group": "edges", "data": data, "classes": " ".join(classes)}


def _segments(sx: float, sy: float, tx: float, ty: float, points: list[list[float]]) -> tuple[list[float], list[float]]:
    """Cytoscape's `segments` edge points as (distance, weight) pairs relative to the line from the
    source to the target (`edge-distances: node-position`): a point P is S + w·(T−S) + d·n, with n
    the unit normal (−dy, dx)/|T−S| cytoscape uses."""
    vx, vy = tx - sx, ty - sy
    length2 = vx * vx + vy * vy or 1.0
    length = math.sqrt(length2)
    dists, weights = [], []
    for px, py in points:
        rx, ry = px - sx, py - sy
        weights.append(round((rx * vx + ry * vy) / length2, 5))
        dists.append(round((-vy * rx + vx * ry) / length, 2))
    return dists, weights


def cytoscape_elements(wire: Wire, layout: dict[str, Any], color_by: str = "norm") -> list[dict[str, Any]]:
    """dash-cytoscape `elements` (preset positions) for a step laid out by `layout_graph`.

    Boxes come first (a compound parent must exist before its children), then nodes, then edges.
    """
    _check(color_by)
    lo, hi = _range(wire, color_by)
    roots = _roots(wire)
    out: list[dict[str, Any]] = []
    for prefix, parent in layout["boxes"].items():
        kind = module_type(wire, prefix)
        data = {"id": box_element(prefix), "label": box_label(wire, prefix), "module": prefix,
                "kind": "box", "type": kind, "text_color": text_color(PAGE_BACKGROUND), "fill": BOX_FILL,
                "w": 1, "h": 1}  # a compound node's size is what it holds: w and h only keep the mappings defined
        if parent:
            data["parent"] = box_element(parent)
        out.append({"group": "nodes", "data": data, "classes": "module"})
    for eid, info in layout["nodes"].items():
        if eid.startswith(MODULE_PREFIX):
            out.append(_module_element(wire, eid, info, color_by, lo, hi))
        else:
            out.append(_op_element(wire, wire["nodes"][int(eid[1:])], info, roots, color_by, lo, hi))
    out.extend(_edge_element(wire, e, layout["nodes"]) for e in layout["edges"])
    return out


# ---------------------------------------------------------------------------- search
SEARCH_ALL = 2000  # up to this many nodes, every search option goes to the browser
SEARCH_HITS = 50  # a bigger step: this many first options, and this many hits per typed query


def searched_on_server(wire: Wire) -> bool:
    """True for a step too big to send every search option to the page (see `search_index`)."""
    return len(wire["nodes"]) > SEARCH_ALL


def search_index(wire: Wire) -> list[dict[str, str]]:
    """`{"label", "value"}` options for a search box: modules, parameters, then every node in the
    order backward ran them. Values are element ids: `m:<module>` or `n<id>`.

    A step with more than `SEARCH_ALL` nodes gets its first `SEARCH_HITS` options only (top-level
    modules first): the rest are found by `search` as the user types."""
    out = _search_options(wire)
    if searched_on_server(wire):
        out.sort(key=lambda o: (not o["value"].startswith(MODULE_PREFIX), o["value"].count(".")))
        return out[:SEARCH_HITS]
    return out


def _search_options(wire: Wire) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for name, m in wire["modules"].items():
        if name == ROOT_MODULE:
            continue
        out.append({"label": f"{name} · {m.get('type', 'module')} (module)", "value": MODULE_PREFIX + name})
    nodes = wire["nodes"]
    for n in nodes:
        if n["param"]:
            out.append({"label": f"{node_label(n, wire)} (parameter)", "value": f"n{n['id']}"})
    for n in sorted(nodes, key=lambda n: (n["order"] is None, n["order"] or 0, n["id"])):
        where = node_module(n) or n["module"] or ""
        name = "AccumulateGrad" if n["name"] == ACCUMULATE else n["name"]
        extra = f" · {n['param']}" if n["param"] else (f" · {where}" if where else "")
        out.append({"label": f"{name}{extra} (n{n['id']})", "value": f"n{n['id']}"})
    return out


def search(wire: Wire, query: str, limit: int = 20) -> list[dict[str, str]]:
    """The first `limit` search options whose label contains `query` (case-insensitive): for a
    dropdown that filters on the server instead of shipping every option of a big graph."""
    q = query.strip().lower()
    if not q:
        return []
    hits = [o for o in _search_options(wire) if q in o["label"].lower()]
    return hits[:limit]


def find(wire: Wire, query: str) -> str | None:
    """Resolve what a user typed to an element id: `n<id>` for a node, `m:<module>` for a module.

    Tried in order: an element id or a bare node number; a module name; a parameter name; an op
    name (`AddmmBackward0` or `Addmm`, the first to run); then any search label containing the
    text. None when nothing matches.
    """
    q = query.strip()
    if not q:
        return None
    nodes = wire["nodes"]
    modules = wire["modules"]
    digits = q[1:] if q[:1] in "nN" else q
    if digits.isdigit():
        return f"n{int(digits)}" if int(digits) < len(nodes) else None
    if q.startswith(MODULE_PREFIX) and q[len(MODULE_PREFIX):] in modules:
        return q
    if q.startswith(BOX_PREFIX) and q[len(BOX_PREFIX):] in modules:
        return MODULE_PREFIX + q[len(BOX_PREFIX):]
    if q in modules and q != ROOT_MODULE:
        return MODULE_PREFIX + q
    for n in nodes:
        if n["param"] == q:
            return f"n{n['id']}"
    low = q.lower()
    ran = sorted(nodes, key=lambda n: (n["order"] is None, n["order"] or 0, n["id"]))
    for n in ran:
        full = n["name"].rsplit("::", 1)[-1].lower()
        if low in (full, node_label(n, wire).lower()):
            return f"n{n['id']}"
    hit = search(wire, q, limit=1)
    return hit[0]["value"] if hit else None
