"""What the offline page of one step shows, as JSON-ready data: built from the step's wire form by the
view layer (`gradscape.app.view`), so the file draws what the live page draws. No Dash, no torch.

    data, cells = page_data(wire)           # wire: the whole step's maps, arrays included
    data, cells = page_data(wire, arrays)   # or a stored step as `read_graph` gives it, and its arrays

- The graph: the views a person can open, laid out here (`app.export.views`).
- Colours, labels, sizes and classes: `cytoscape_elements`, the same for an element in every state.
- The inspector: `slot_figures(..., plotly=False)` (labels, titles, statistics, which 2-D view) and each
  tensor's heatmap once, up to `CELL_BUDGET` (NOTE [Export budgets] in views.py), quantised to 8 bits over
  the map's own symmetric range (the colour scale has no more levels than that; the statistics next to it
  are exact), in one base64 blob.
- The problems: `problem_lines`. The player: the backward order. The header's notes: `step_notes` (a
  compiled model's step ran eagerly, was replayed, was compared; the comparison's table and colouring
  are the live page's only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from gradscape.app.export.views import fold_states
from gradscape.app.view import legend
from gradscape.app.view.compiled import step_notes
from gradscape.app.view.heatmaps import ARRIVING, SENT, slot_figures
from gradscape.app.view.problems import problem_lines
from gradscape.tracer.wire import TensorArrays, WireStep
from gradscape.tracer.wire.lazy import indexed

LEVELS = 250  # heatmap cell codes 0..250 run from -m to +m (125: 0)
NAN_CODE, POS_INF_CODE, NEG_INF_CODE, PAD_CODE = 251, 252, 253, 254
# NOTE [Export budgets] (app/export/views.py) bounds the views laid out; the heatmaps' cells are kept up to
# `CELL_BUDGET` bytes, in node order (a slot past it keeps its statistics and says why it has no picture).
CELL_BUDGET = 3 * 1024 * 1024
LEFT_OUT = "picture left out of this file (its pictures' budget is spent); the statistics are exact"


def page_data(wire: WireStep, arrays: Mapping[int, TensorArrays] | None = None) -> tuple[dict[str, Any], bytes]:
    """(everything the offline page needs for one step, the heatmaps' cell codes one after the other:
    a heatmap's `offset` says where its rows × cols codes start). `arrays`: each tensor's thumbnail and
    values by index (`TraceStore.read_arrays`), else those `wire`'s tensors hold. See the module's docstring."""
    wire = indexed(wire)  # every fold state reads the step's index: made once
    if arrays is None:
        arrays = {i: {"thumb": t.get("thumb"), "values": t.get("values")} for i, t in enumerate(wire["tensors"])}
    elements, edge_labels, states, show, left_out = fold_states(wire)
    cells = bytearray()
    nodes, heatmaps, stats = inspector_data(wire, arrays, cells)
    return {
        "run": wire["run"], "step": wire["step"], "rank": wire.get("rank"), "error": wire.get("error"),
        "legend": {k: v for k, v in legend(wire, "norm").items() if k in ("title", "min_label", "max_label",
                                                                             "css_gradient")},
        "elements": elements, "edge_labels": edge_labels, "states": states, "show": show,
        "states_left_out": left_out,
        "nodes": nodes, "heatmaps": heatmaps, "stats": stats, "problems": problem_lines(wire)["lines"],
        "notes": step_notes(wire),  # what the step says of torch.compile, in the header (`step_html`)
        "titles": {"grad_outputs": ARRIVING, "grad_inputs": SENT},
        "order": [n["id"] for n in sorted((n for n in wire["nodes"] if n["order"] is not None),
                                          key=lambda n: n["order"] or 0)],
        "codes": {"levels": LEVELS, "nan": NAN_CODE, "pos_inf": POS_INF_CODE, "neg_inf": NEG_INF_CODE,
                  "pad": PAD_CODE},
    }, bytes(cells)


# ---------------------------------------------------------------------------- inspector
def inspector_data(wire: WireStep, arrays: Mapping[int, TensorArrays],
                   cells: bytearray) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(each node's inspector text and slots, the heatmaps of the tensors they name, their cell codes
    appended to `cells`, and each tensor's statistics rows [[stat, text]]). A tensor shared by two slots (an
    edge's two ends) is drawn and counted once: a slot names its tensor."""
    nodes = []
    heatmaps: dict[str, Any] = {}
    memo: dict[int, Any] = {}  # each tensor's statistics, once
    for n in wire["nodes"]:
        pick = _pictures(n, arrays, heatmaps, len(cells))
        panel = slot_figures(wire, n["id"], pick, plotly=False, memo=memo)
        slots = {}
        for kind in ("grad_outputs", "grad_inputs"):
            slots[kind] = [_slot_text(s) for s in panel[kind]["slots"]]
            for s in panel[kind]["slots"]:
                if s["tensor"] in pick and str(s["tensor"]) not in heatmaps:
                    heatmaps[str(s["tensor"])] = heatmap(s, cells)
        nodes.append({"id": n["id"], "name": n["name"], "kind": n["kind"], "module": n["module"],
                      "param": n["param"], "source": n["source"], "schema": n["schema"], "order": n["order"],
                      "explain": panel["explain"], "time_us": n["t"],
                      "in_shapes": n["in_shapes"], "out_shapes": n["out_shapes"],
                      "grad_outputs": slots["grad_outputs"], "grad_inputs": slots["grad_inputs"]})
    return nodes, heatmaps, {str(i): [[r["stat"], r["text"]] for r in rows] for i, rows in memo.items()}


def _pictures(node: Mapping[str, Any], arrays: Mapping[int, TensorArrays], heatmaps: dict[str, Any],
              used: int) -> dict[int, TensorArrays]:
    """The arrays of `node`'s tensors not drawn yet, while their cells fit NOTE [Export budgets] (`used`
    bytes spent); a tensor past it gets the note saying so in `heatmaps`."""
    pick: dict[int, TensorArrays] = {}
    for idx in (node["go"] or []) + (node["gi"] or []):
        if idx is None or str(idx) in heatmaps or idx in pick or idx not in arrays:
            continue
        thumb = arrays[idx]["thumb"]
        size = math.prod(thumb["shape"]) if thumb is not None else 0
        if used + size > CELL_BUDGET:
            heatmaps[str(idx)] = {"note": LEFT_OUT}
            continue
        pick[idx] = arrays[idx]
        used += size
    return pick


def _slot_text(s: dict[str, Any]) -> dict[str, Any]:
    return {"label": s["label"], "title": s["title"], "tensor": s["tensor"],
            "note": s["note"] if s["tensor"] is None else None}


def heatmap(slot: dict[str, Any], cells: bytearray) -> dict[str, Any] | None:
    """One slot's heatmap from its cells (`heatmaps.slot_figures(..., plotly=False)`): its cell codes (appended
    to `cells`), the symmetric range (the live page's: the largest finite |value|, 1 when none), the
    cells' tensor indices and the words for its view and source."""
    grid = slot.get("grid")
    if grid is None:
        return None if slot["note"] is None else {"note": slot["note"]}
    z, pad, where = np.asarray(grid["z"], dtype=np.float64), grid["pad"], grid["where"]
    ok = np.isfinite(z)
    whole = bool(ok.all())  # most maps: no NaN/Inf, so no masks
    finite = z if whole else z[ok]
    m = float(np.abs(finite).max()) if finite.size else 0.0
    m = m if m > 0 else 1.0
    levels = np.clip(np.rint((finite / m + 1.0) / 2.0 * LEVELS), 0, LEVELS).astype(np.uint8)
    key: list[str] = []
    if whole:
        codes = levels
    else:
        codes = np.full(z.shape, PAD_CODE, dtype=np.uint8)
        codes[ok] = levels
        bad = ~ok & ~pad
        # the non-finite cells present, named under the map as on the live page (their colours are off the scale)
        for code, name, mask in ((NAN_CODE, "nan", np.isnan(z)), (POS_INF_CODE, "pos_inf", np.isposinf(z)),
                                 (NEG_INF_CODE, "neg_inf", np.isneginf(z))):
            if (hit := bad & mask).any():
                codes[hit] = code
                key.append(name)
    offset = len(cells)
    cells += codes.tobytes()
    return {"rows": int(z.shape[0]), "cols": int(z.shape[1]), "m": m, "offset": offset,
            "x": _edges(where.get("x")), "y": _edges(where.get("y")), "ticks": where.get("ticks", True),
            "x_title": where.get("x_title", "col"), "y_title": where.get("y_title", "row"),
            "view": slot["view"], "source": slot["source"], "note": slot["note"], "key": key}


def _edges(edges: list[float] | None) -> list[int] | None:
    """A blocked view's cell edges as the tensor indices where each cell starts (the figure puts them
    half a cell early, at index − 0.5)."""
    return None if edges is None else [int(math.floor(e + 0.5)) for e in edges]
