"""What the offline page of one step shows, as JSON-ready data: built from the step's wire form by the
view layer (`gradscape.app.view`), so the file draws what the live page draws. No Dash, no torch.

    data = page_data(wire)           # wire: the whole step, arrays included (`step_to_wire`)

- The graph: a page without a server cannot lay out again, so every view a person can open is laid
  out here. The step opens folded as the live page opens it (`default_collapse`); opening a folded
  module is `expand_one_level`, as on the page. Each module that can be opened gets the layout of
  the step with the modules around it open (`states`, keyed by that module; "" is the first view,
  and each state names the one it was opened from). So the file opens one path of modules at a
  time: opening a module elsewhere folds the path that was open.
- Colours, labels, sizes and classes: `cytoscape_elements`, the same for an element in every state.
- The inspector: `slot_figures` / `slot_of` (labels, titles, statistics, which 2-D view) and each
  tensor's heatmap once, quantised to 8 bits over the map's own symmetric range (the colour scale
  has no more levels than that; the statistics next to it are exact), in one base64 blob.
- The problems: `problem_lines`. The player: the backward order. The header's notes: `step_notes` (a
  compiled model's step ran eagerly, was replayed, was compared; the comparison's table and colouring
  are the live page's only).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from gradscape.app.view import MAX_DRAWN, cytoscape_elements, default_collapse, expand_one_level, layout_graph, legend
from gradscape.app.view.compiled import step_notes
from gradscape.app.view.heatmaps import ARRIVING, SENT, slot_figures, slot_of
from gradscape.app.view.layout import box_bounds
from gradscape.app.view.problems import problem_lines
from gradscape.tracer.wire import TensorArrays, WireStep
from gradscape.tracer.wire.lazy import indexed

LEVELS = 250  # heatmap cell codes 0..250 run from -m to +m (125: 0)
NAN_CODE, POS_INF_CODE, NEG_INF_CODE, PAD_CODE = 251, 252, 253, 254
DEFAULT_STATE = ""
# NOTE [Export budgets]: a 10,290-node step wrote 29.65 MB in 33 s, and a one-pass 10k-node LSTMCell loop
# took 266 s, laying out every view that can be opened (up to 400, each of the whole graph). The file lays
# out views breadth first until `STATE_ELEMENTS` elements are placed in all (the first view always; a
# module past the budget stays folded in the file: `states_left_out` counts those of the views laid out),
# and keeps heatmap cells up to `CELL_BUDGET` bytes, in node order (a slot past it keeps its statistics and
# says why it has no picture). `gradscape serve` shows everything.
STATE_ELEMENTS = 30_000
CELL_BUDGET = 3 * 1024 * 1024
LEFT_OUT = "picture left out of this file (its pictures' budget is spent); the statistics are exact"


def page_data(wire: WireStep) -> tuple[dict[str, Any], bytes]:
    """(everything the offline page needs for one step, the heatmaps' cell codes one after the other:
    a heatmap's `offset` says where its rows × cols codes start). See the module's docstring."""
    wire = indexed(wire)  # every fold state reads the step's index: made once
    arrays: dict[int, TensorArrays] = {i: {"thumb": t.get("thumb"), "values": t.get("values")}
                                       for i, t in enumerate(wire["tensors"])}
    elements, edge_labels, states, show, left_out = fold_states(wire)
    cells = bytearray()
    nodes, heatmaps = inspector_data(wire, arrays, cells)
    return {
        "run": wire["run"], "step": wire["step"], "rank": wire.get("rank"), "error": wire.get("error"),
        "legend": {k: v for k, v in legend(wire, "norm").items() if k in ("title", "min_label", "max_label",
                                                                             "css_gradient")},
        "elements": elements, "edge_labels": edge_labels, "states": states, "show": show,
        "states_left_out": left_out,
        "nodes": nodes, "heatmaps": heatmaps, "problems": problem_lines(wire)["lines"],
        "notes": step_notes(wire),  # what the step says of torch.compile, in the header (`step_html`)
        "titles": {"grad_outputs": ARRIVING, "grad_inputs": SENT},
        "order": [n["id"] for n in sorted((n for n in wire["nodes"] if n["order"] is not None),
                                          key=lambda n: n["order"] or 0)],
        "codes": {"levels": LEVELS, "nan": NAN_CODE, "pos_inf": POS_INF_CODE, "neg_inf": NEG_INF_CODE,
                  "pad": PAD_CODE},
    }, bytes(cells)


# ---------------------------------------------------------------------------- graph states
def fold_states(wire: WireStep, max_states: int = 400, budget: int | None = None) -> tuple[
        dict[str, Any], dict[str, str], dict[str, Any], dict[int, str], int]:
    """(elements, edge labels, states, the state that shows each node, modules left folded), breadth first
    from the first view: a module is laid out opened from the state where it first appears folded. At
    most `max_states` states, and none past `budget` elements placed in all (NOTE [Export budgets]); a
    module past either stays folded in the file."""
    elements: dict[str, Any] = {}
    edge_labels: dict[str, str] = {}
    states: dict[str, Any] = {}
    show: dict[int, str] = {}
    queue: deque[tuple[str, str | None, set[str]]] = deque([(DEFAULT_STATE, None, default_collapse(wire))])
    queued = {DEFAULT_STATE}
    placed, budget = 0, STATE_ELEMENTS if budget is None else budget
    while queue and len(states) < max_states and (not states or placed < budget):
        key, parent, collapsed = queue.popleft()
        layout = layout_graph(wire, collapsed, max_drawn=MAX_DRAWN)
        placed += len(layout["nodes"])
        states[key] = view_state(wire, layout, parent, elements, edge_labels)
        for eid in layout["nodes"]:
            if eid.startswith("n"):
                show.setdefault(int(eid[1:]), key)
        for module in layout["collapsed"]:
            if module not in queued:
                queued.add(module)
                queue.append((module, key, expand_one_level(wire, collapsed, module)))
    return elements, edge_labels, states, show, len(queue)


def _r(v: float) -> float:
    return round(float(v), 1)


def view_state(wire: WireStep, layout: dict[str, Any], parent: str | None, elements: dict[str, Any],
           edge_labels: dict[str, str]) -> dict[str, Any]:
    """One laid-out view: `nodes` [[element, x, y, w, h]] (centres), `boxes` [[module, x1, y1, x2, y2]],
    `edges` [[source, target, classes, [x, y, ...] bends]]; what each element looks like goes once
    into `elements`, each edge's slot labels into `edge_labels`."""
    drawn = cytoscape_elements(wire, layout, "norm")
    bounds = box_bounds(layout)
    nodes, boxes, edges = [], [], []
    for el in drawn:
        d = el["data"]
        if el["group"] == "edges":
            edge_labels.setdefault(f"{d['source']}>{d['target']}", d["label"])
            continue
        if d["id"] not in elements:
            elements[d["id"]] = _look(d, el.get("classes", ""), layout)
        if d["kind"] == "box":
            x1, y1, x2, y2 = bounds.get(d["module"], (0.0, 0.0, 0.0, 0.0))
            boxes.append([d["module"], _r(x1), _r(y1), _r(x2), _r(y2)])
        else:
            p = el["position"]
            nodes.append([d["id"], _r(p["x"]), _r(p["y"]), _r(d["w"]), _r(d["h"])])
    for e in layout["edges"]:
        classes = ("up" if e.get("up") else "") + (" merged" if len(e["slots"]) > 1 else "")
        edges.append([e["source"], e["target"], classes.strip(), [_r(c) for pt in e.get("bends") or [] for c in pt]])
    return {"parent": parent, "nodes": nodes, "boxes": boxes, "edges": edges}


def _look(d: dict[str, Any], classes: str, layout: dict[str, Any]) -> dict[str, Any]:
    """What an element looks like whatever the state: label, fill, label colour, classes, hover title."""
    look = {"label": d["label"], "fill": d.get("fill"), "text": d.get("text_color"), "classes": classes,
            "title": d.get("title", d["label"]), "kind": d["kind"]}
    if d["kind"] == "module":
        look["members"] = layout["nodes"][d["id"]].get("members") or []
    if "node" in d:
        look["node"] = d["node"]
    return look


# ---------------------------------------------------------------------------- inspector
def inspector_data(wire: WireStep, arrays: Mapping[int, TensorArrays],
                   cells: bytearray) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(each node's inspector text and slots, the heatmaps of the tensors they name, their cell codes
    appended to `cells`). A tensor shared by two slots (an edge's two ends) is drawn once."""
    nodes = []
    heatmaps: dict[str, Any] = {}
    for n in wire["nodes"]:
        panel = slot_figures(wire, n["id"], {})  # labels, titles, statistics: no arrays, so no figures here
        slots = {}
        for kind in ("grad_outputs", "grad_inputs"):
            slots[kind] = [_slot_text(s) for s in panel[kind]["slots"]]
            for s in panel[kind]["slots"]:
                idx = s["tensor"]
                if idx is not None and str(idx) not in heatmaps and idx in arrays:
                    thumb = arrays[idx]["thumb"]
                    # see NOTE [Export budgets] above
                    if thumb is not None and len(cells) + math.prod(thumb["shape"]) > CELL_BUDGET:
                        heatmaps[str(idx)] = {"note": LEFT_OUT}
                        continue
                    slot = slot_of(wire, kind, s["slot"], idx, s["label"], {idx: arrays[idx]})
                    heatmaps[str(idx)] = heatmap(slot, cells)
        nodes.append({"id": n["id"], "name": n["name"], "kind": n["kind"], "module": n["module"],
                      "param": n["param"], "source": n["source"], "schema": n["schema"], "order": n["order"],
                      "explain": panel["explain"], "time_us": n["t"],
                      "in_shapes": n["in_shapes"], "out_shapes": n["out_shapes"],
                      "grad_outputs": slots["grad_outputs"], "grad_inputs": slots["grad_inputs"]})
    return nodes, heatmaps


def _slot_text(s: dict[str, Any]) -> dict[str, Any]:
    return {"label": s["label"], "title": s["title"], "tensor": s["tensor"], "shape": s["shape"],
            "dtype": s["dtype"], "note": s["note"] if s["tensor"] is None else None,
            "stats": [[r["stat"], r["text"]] for r in s["stats"]]}


def heatmap(slot: dict[str, Any], cells: bytearray) -> dict[str, Any] | None:
    """One slot's heatmap from its plotly figure (`heatmaps.heatmap_figure`): its cell codes (appended
    to `cells`), the symmetric range, the cells' tensor indices and the words for its view and source."""
    fig = slot["figure"]
    if fig is None:
        return None if slot["note"] is None else {"note": slot["note"]}
    main = fig["data"][0]
    z = np.array([[np.nan if v is None else v for v in row] for row in main["z"]], dtype=np.float64)
    marks = None
    if len(fig["data"]) > 1:
        marks = np.array([[np.nan if v is None else v for v in row] for row in fig["data"][1]["z"]])
    m = float(main["zmax"])
    codes = np.full(z.shape, PAD_CODE, dtype=np.uint8)
    ok = np.isfinite(z)
    codes[ok] = np.clip(np.rint((z[ok] / m + 1.0) / 2.0 * LEVELS), 0, LEVELS).astype(np.uint8)
    if marks is not None:
        for code, mark in ((NAN_CODE, 1.0), (POS_INF_CODE, 2.0), (NEG_INF_CODE, 3.0)):
            codes[marks == mark] = code
    layout = fig["layout"]
    offset = len(cells)
    cells += codes.tobytes()
    return {"rows": int(z.shape[0]), "cols": int(z.shape[1]), "m": m, "offset": offset,
            "x": _edges(main.get("x")), "y": _edges(main.get("y")), "ticks": layout["xaxis"]["showticklabels"],
            "x_title": layout["xaxis"]["title"]["text"], "y_title": layout["yaxis"]["title"]["text"],
            "view": slot["view"], "source": slot["source"], "note": slot["note"]}


def _edges(edges: list[float] | None) -> list[int] | None:
    """A blocked view's cell edges as the tensor indices where each cell starts (the figure puts them
    half a cell early, at index − 0.5)."""
    return None if edges is None else [int(math.floor(e + 0.5)) for e in edges]
