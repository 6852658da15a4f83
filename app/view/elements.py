"""Cytoscape elements for the graph view: the step's nodes, module boxes and edges as plain dicts.

Turning the domain into elements is a pure function (as in dash-cytoscape's own utilities), so a
callback is `cytoscape_elements(wire, layout_graph(wire, collapsed), color_by)`.

Every element has an explicit `group` ("nodes"/"edges"). Element ids: `n12` (node 12), `m:blocks.3` (a
folded module), `g:blocks.3` (the box of an expanded module: a compound parent, `data.parent` of what is
drawn inside it; `g:cell#17`, of a call opened into its ops), `c:cell#17` and `c:cell#more` (a folded call
of a module opened into its calls, and its calls not drawn yet: app/view/call_folds.py), `o:scan#0.3` (a run
of a box's ops: app/view/op_runs.py), `e:<source>><target>` (edges).

Classes a stylesheet can select on:
    nodes: the node kind (`op param leaf compiled checkpoint custom hook`), `root` (where backward
    started), `notrun` (did not execute in this step), `collapsed` (a folded module, call or run; `call` too
    for a call, `run` for a run of ops, `more` for the calls or runs not drawn yet), `module` (a
    box), `nan` (a NaN or Inf in its gradients; `data.badge` says which), `zerograd` (the gradient
    that arrived is all zeros), `worstdiff` (colouring `compiled`: the parameter whose compiled gradient is
    furthest from the eager one);
    edges: `merged` (stands for several wire edges), `up` (closes a cycle that folding made),
    `bent` (a long edge routed through `data.bend_d` / `data.bend_w`, for the style
    `{"curve-style": "segments", "edge-distances": "node-position", "segment-distances":
    "data(bend_d)", "segment-weights": "data(bend_w)"}`).

A node's source line is `data.line` (never `data.source`: cytoscape reads `source` as an edge's
end). Colour: `data.color` is the chosen statistic of the node's `grad_outputs[0]` (what arrived from
the loss side) through a sequential scale (`colours`, whose `legend()` gives the range and ticks).
"""

from __future__ import annotations

import math
from typing import Any

from gradscape.app.view.collapse import box_label, module_label
from gradscape.app.view.colours import (
    BOX_FILL,
    NAN_FILL,
    PAGE_BACKGROUND,
    arrived,
    statistic,
    text_color,
)
from gradscape.app.view.compiled import DIFF
from gradscape.app.view.ids import box_element, call_of, module_of, node_element, node_of, run_of
from gradscape.app.view.marks import StepMarks, step_marks
from gradscape.app.view.step_fields import (
    StepIndex,
    Wire,
    fmt_shape,
    module_type,
    node_label,
    numel,
    slot_labels,
    stat,
    step_index,
    tensor,
)
from gradscape.tracer.wire import WireNode


def _badge_text(nan: int, inf: int) -> str | None:
    parts = (["NaN"] if nan else []) + (["Inf"] if inf else [])
    return "/".join(parts) or None


def _roots(wire: Wire) -> set[int]:
    roots = {r for p in wire["passes"] for r in p["roots"]}
    if not roots and wire["nodes"]:
        has_in = {dst for _, dst, _ in wire["edges"]}
        roots = {k for k in range(len(wire["nodes"])) if k not in has_in}  # (node ids are positions: no map made)
    return roots


def _op_element(wire: Wire, node: WireNode, info: dict[str, Any], roots: set[int], marks: StepMarks) -> dict[str, Any]:
    got = arrived(wire, node)
    nan, inf = marks.badges[node["id"]]
    classes = [node["kind"] or "op"]
    if node["id"] in roots:
        classes.append("root")
    if node["order"] is None:
        classes.append("notrun")
    if nan or inf:
        classes.append("nan")
    if got is not None and numel(got["shape"]) and stat(got, "zeros") == numel(got["shape"]):
        classes.append("zerograd")
    out_shape = got["shape"] if got is not None else (node["out_shapes"] or [None])[0]
    data: dict[str, Any] = {
        "id": node_element(node["id"]), "node": node["id"], "label": node_label(node, wire), "name": node["name"],
        "kind": node["kind"] or "op", "module": node["module"], "param": node["param"],
        "line": node["source"], "order": node["order"], "shape": fmt_shape(out_shape),
        "badge": _badge_text(nan, inf), "nan": nan, "inf": inf,
        **marks.fields(marks.values[node["id"]]), "w": info["w"], "h": info["h"],
    }
    if marks.worst is not None and node["param"] == marks.worst:
        classes.append("worstdiff")  # NOTE [Difference colouring] in app/view/compiled.py
    _paint(data)
    if info.get("parent"):
        data["parent"] = box_element(info["parent"])
    where = " · ".join(str(p) for p in (node["module"] or node["param"], node["source"]) if p)
    what = "max |compiled − eager|" if marks.color_by == DIFF else f"∂L/∂output {data['shape']}"
    data["title"] = f"{node['name']}" + (f" · {where}" if where else "") + f"\n{what}: " + data["value_text"]
    return {"group": "nodes", "data": data, "position": {"x": info["x"], "y": info["y"]},
            "classes": " ".join(classes)}


def _module_element(wire: Wire, eid: str, info: dict[str, Any], marks: StepMarks) -> dict[str, Any]:
    prefix = module_of(eid) or ""
    members = info.get("members") or []
    mod = wire["modules"].get(prefix)
    calls = mod["calls"] if mod else []
    go = calls[0]["go"] if calls else []
    got = tensor(wire, go[0]) if go else None
    if got is not None and marks.color_by != DIFF:
        value = statistic(got, marks.color_by)
    else:  # no module-level gradient (never called, or its output needed none): the largest inside
        vals = [v for v in (marks.values[i] for i in members) if v is not None]
        value = max(vals) if vals else None
    nan = sum(marks.badges[i][0] for i in members) if marks.flagged else 0  # a fold of a loop holds 100k nodes
    inf = sum(marks.badges[i][1] for i in members) if marks.flagged else 0
    kind = module_type(wire, prefix)
    label = module_label(wire, prefix, len(members))
    data: dict[str, Any] = {"id": eid, "label": label, "module": prefix, "kind": "module", "type": kind,
                            "count": len(members), "badge": _badge_text(nan, inf), "nan": nan, "inf": inf,
                            **marks.fields(value), "w": info["w"],
                            "h": info["h"]}
    _paint(data)
    if info.get("parent"):
        data["parent"] = box_element(info["parent"])
    what = "largest max |compiled − eager| inside" if marks.color_by == DIFF else "∂L/∂output"
    data["title"] = label.replace("\n", " · ") + f" (folded; click to expand)\n{what}: {data['value_text']}"
    classes = ["collapsed"] + (["nan"] if nan or inf else [])
    return {"group": "nodes", "data": data, "position": {"x": info["x"], "y": info["y"]},
            "classes": " ".join(classes)}


def id_ranges(ids: list[int]) -> list[list[int]]:
    """Node ids as [first, last] runs of consecutive ids, in order: `[3, 4, 5, 9]` → `[[3, 5], [9, 9]]`."""
    out: list[list[int]] = []
    for i in sorted(ids):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def _call_element(wire: Wire, eid: str, info: dict[str, Any], marks: StepMarks) -> dict[str, Any]:
    """A folded call of a module opened into its calls (`c:cell#17`), its calls not drawn yet
    (`c:cell#more`), or a run of a box's ops (`o:scan#0.3`): coloured by what arrived at the call's output,
    else the largest value inside."""
    run = run_of(eid)
    module, call = (run[0], None) if run else call_of(eid) or ("", None)
    members = info.get("members") or []
    calls = (wire["modules"].get(module) or {"calls": []})["calls"]
    go = calls[call - 1]["go"] if call is not None and 0 < call <= len(calls) else []
    got = tensor(wire, go[0]) if go else None
    if got is not None and marks.color_by != DIFF:
        value = statistic(got, marks.color_by)
    else:
        vals = [v for v in (marks.values[i] for i in members) if v is not None]
        value = max(vals) if vals else None
    nan = sum(marks.badges[i][0] for i in members) if marks.flagged else 0
    inf = sum(marks.badges[i][1] for i in members) if marks.flagged else 0
    label = info.get("label") or eid
    data: dict[str, Any] = {"id": eid, "label": label, "module": module, "call": call,
                            "kind": "run" if run else "call",
                            "type": module_type(wire, module), "count": len(members), "badge": _badge_text(nan, inf),
                            "nan": nan, "inf": inf, **marks.fields(value),
                            "w": info["w"], "h": info["h"], "parent": box_element(module)}
    # the player finds its nodes in it (assets/player.js), under "more" and in a call of 10k ops too: as
    # [first, last] runs of ids (a call's nodes are mostly one run; 538 runs for the 8,070 under "more" of
    # a 10k-node loop)
    data["ranges"] = id_ranges(members)
    _paint(data)
    more = run[2] == 0 if run else call is None
    what = f"click to draw more {'runs' if run else 'calls'}" if more else "click to open its ops"
    shown = "largest max |compiled − eager| inside" if marks.color_by == DIFF else "∂L/∂output"
    data["title"] = label.replace("\n", " · ") + f" (folded; {what})\n{shown}: {data['value_text']}"
    classes = ["collapsed", "run" if run else "call"] + (["more"] if more else []) + (["nan"] if nan or inf else [])
    return {"group": "nodes", "data": data, "position": {"x": info["x"], "y": info["y"]},
            "classes": " ".join(classes)}


def _paint(data: dict[str, Any]) -> None:
    """The fill a node is drawn with (`data.fill`: its colour, or red for NaN/Inf) and the label
    colour that reads on it (`data.text_color`)."""
    data["fill"] = NAN_FILL if data.get("nan") or data.get("inf") else data["color"]
    data["text_color"] = text_color(data["fill"])


def _edge_element(wire: Wire, index: StepIndex, edge: dict[str, Any],
                  layout_nodes: dict[str, Any]) -> dict[str, Any]:
    slots = edge["slots"]
    labels = []
    for src, _dst, slot in slots[:4]:
        node_labels = slot_labels(wire, src)
        labels.append(node_labels[slot] if slot < len(node_labels) else f"input {slot}")
    sent = index.sent_norms(slots)  # read from the step's index: a folded loop's edge stands for 10k slots
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


def cytoscape_elements(wire: Wire, layout: dict[str, Any], color_by: str = "norm",
                       marks: StepMarks | None = None) -> list[dict[str, Any]]:
    """dash-cytoscape `elements` (preset positions) for a step laid out by `layout_graph`; `marks` are the
    step's `marks.step_marks` for `color_by` when the caller keeps them (the page does, per step).

    Boxes come first (a compound parent must exist before its children), then nodes, then edges.
    """
    if marks is None or marks.color_by != color_by:
        marks = step_marks(wire, color_by)
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
        nid = node_of(eid)
        if nid is None:
            out.append(_call_element(wire, eid, info, marks) if call_of(eid) is not None or run_of(eid) is not None
                       else _module_element(wire, eid, info, marks))
        else:
            out.append(_op_element(wire, wire["nodes"][nid], info, roots, marks))
    index = step_index(wire)
    out.extend(_edge_element(wire, index, e, layout["nodes"]) for e in layout["edges"])
    return out
