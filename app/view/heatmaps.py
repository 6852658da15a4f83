"""The inspector's heatmaps: every gradient slot of one node, with its label, shape and statistics.

A node shows what ARRIVED (`grad_outputs`, ∂L/∂ its forward outputs, from the loss side) and what
it SENT ON (`grad_inputs`, ∂L/∂ its forward inputs, one per slot, labelled `mat2 → fc2.weight
(transposed)`). Gradients are signed, so the colour scale diverges at 0 and is symmetric: the same
colour intensity means the same magnitude on either side.

Values come from the store's `read_arrays(run, step, indices)`: full values when the tracer kept
them (`tensors="full"`), else the thumbnail. Both are shown through the same 2-D grid of the tensor
(`grid`), so a full-values map and a thumbnail line up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from gradscape.app.view.grid import positions, thumb_blocks, thumb_padding, view_2d, view_words
from gradscape.app.view.ids import node_element, node_index
from gradscape.app.view.step_fields import ACCUMULATE, Wire, fmt_num, fmt_shape, numel, stat, tensor
from gradscape.tracer.report import percent
from gradscape.tracer.wire import TensorArrays, WireArray, WireNode, WireTensor, decode_array

DIVERGING = "RdBu_r"  # blue < 0 < red, white at 0
NONFINITE_COLORS = {1: "#000000", 2: "#ff00ff", 3: "#00c000"}  # NaN, +Inf, -Inf cells drawn over the map
NONFINITE_NAMES = {1: "NaN", 2: "+Inf", 3: "−Inf"}
ARRIVING = "Arriving: grad_outputs (∂L/∂ outputs)"
SENT = "Sent on: grad_inputs (∂L/∂ inputs)"


# ---------------------------------------------------------------------------- figures
def figure_height(z: np.ndarray) -> int:
    """The figure's height in pixels; the page gives its graph the same height, so nothing is drawn
    past the graph's box (over the next heading)."""
    rows = z.shape[0] if z.ndim == 2 else 1
    return 150 if rows <= 2 else 320


def heatmap_figure(z: np.ndarray, title: str, padding: np.ndarray | None = None,
                   where: dict[str, Any] | None = None) -> dict[str, Any]:
    """A plotly figure dict: diverging scale centred at 0, symmetric (zmin = −m, zmax = m with m the
    largest finite |value| shown), rows downwards like a matrix. NaN and ±Inf cells are drawn over
    it in fixed colours (black, magenta, green): a debugger must show them, not blank them.
    `where` (from `positions`) places the cells at the tensor's own indices and words the hover."""
    z = np.asarray(z, dtype=np.float64)
    pad = np.zeros(z.shape, dtype=bool) if padding is None else padding
    finite = np.isfinite(z)
    m = float(np.abs(z[finite]).max()) if finite.any() else 0.0
    m = m if m > 0 else 1.0  # an all-zero gradient: any symmetric range shows it white
    w = where or {}
    main: dict[str, Any] = {
        "type": "heatmap", "z": _to_lists(np.where(finite, z, np.nan)), "colorscale": DIVERGING,
        "zmin": -m, "zmax": m, "zmid": 0.0, "colorbar": {"thickness": 12, "tickformat": ".2g"},
        "hovertemplate": "row %{y}, col %{x}<br>%{z:.9g}<extra></extra>", "name": "gradient",
    }
    for key in ("x", "y", "text"):
        if w.get(key) is not None:
            main[key] = w[key]
    if w.get("text") is not None:
        main["hovertemplate"] = "%{text}<extra></extra>"
    if not (finite & ~pad).any():
        main["showscale"] = False  # nothing finite to scale: the key under the map names the colours
    data: list[dict[str, Any]] = [main]
    bad = ~finite & ~pad
    if bad.any():
        code = np.where(np.isnan(z), 1.0, np.where(z > 0, 2.0, 3.0))
        marks = np.where(bad, code, np.nan)
        data.append({
            "type": "heatmap", "z": _to_lists(marks), "zmin": 1, "zmax": 3, "showscale": False,
            "colorscale": [[0.0, NONFINITE_COLORS[1]], [0.5, NONFINITE_COLORS[2]], [1.0, NONFINITE_COLORS[3]]],
            "hovertemplate": "row %{y}, col %{x}<br>non-finite (1 NaN, 2 +Inf, 3 −Inf): %{z}<extra></extra>",
            "name": "NaN/Inf", **{k: w[k] for k in ("x", "y") if w.get(k) is not None},
        })
    ticks = w.get("ticks", True)
    axis = {"showticklabels": ticks, "ticks": "outside" if ticks else "", "automargin": True}
    layout = {"title": {"text": title, "font": {"size": 12}}, "margin": {"l": 40, "r": 10, "t": 44, "b": 30},
              "yaxis": {"autorange": "reversed", "title": {"text": w.get("y_title", "row")}, **axis},
              "xaxis": {"title": {"text": w.get("x_title", "col")}, **axis},
              "height": figure_height(z)}
    return {"data": data, "layout": layout}


def nonfinite_key(z: np.ndarray, padding: np.ndarray | None = None) -> list[dict[str, str]]:
    """The key of the non-finite cells a map shows (`{"name", "colour"}` for each of NaN, +Inf, −Inf there),
    drawn under it: their colours are outside the map's scale."""
    z = np.asarray(z, dtype=np.float64)
    shown = np.ones(z.shape, dtype=bool) if padding is None else ~padding
    present = {1: np.isnan(z) & shown, 2: np.isposinf(z) & shown, 3: np.isneginf(z) & shown}
    return [{"name": NONFINITE_NAMES[k], "colour": NONFINITE_COLORS[k]} for k, m in present.items() if m.any()]


def _to_lists(a: np.ndarray) -> list[list[float | None]]:
    """Nested lists with None for NaN (JSON has no NaN; plotly leaves None cells empty)."""
    return [[None if math.isnan(v) else v for v in row] for row in a.tolist()]


# ---------------------------------------------------------------------------- stats
STAT_ROWS = ("min", "max", "mean", "std", "norm", "nan", "inf", "zeros%")


def stats_rows(t: WireTensor | None) -> list[dict[str, Any]]:
    """The statistics table of one slot: rows of `{"stat", "value", "text"}` (zeros as a percentage
    of the elements)."""
    if t is None:
        return []
    out = []
    n = numel(t["shape"])
    for name in STAT_ROWS:
        if name == "zeros%":
            zeros = stat(t, "zeros") or 0.0
            value: float | None = 100.0 * zeros / n if n else None
            text = "—" if value is None else percent(zeros / n, 1)
        else:
            value = stat(t, name)
            text = str(int(value)) if name in ("nan", "inf") and value is not None else fmt_num(value)
            if name in ("norm", "mean", "std") and (stat(t, "nan") or 0) > 0:
                value, text = math.nan, "nan"  # over values with a NaN among them (not the finite ones' norm)
            elif name == "norm" and (stat(t, "inf") or 0) > 0:
                value, text = math.inf, "inf"
        out.append({"stat": name, "value": value, "text": text})
    return out


# ---------------------------------------------------------------------------- slots
def _decode(a: WireArray | None, key: str) -> np.ndarray | None:
    return None if a is None else decode_array(a, key)


def _no_thumb_note(wire: Wire, t: WireTensor) -> str:
    """Why a tensor has no picture: left out by the step's thumbnail budget (NOTE [Thumbnail budget]
    in tracer/summary/budget.py: every tensor without one whose norm is at most the largest left out),
    or none was kept."""
    out = wire["meta"].get("thumbs_left_out")
    norm = stat(t, "norm")
    if isinstance(out, dict) and norm is not None and norm <= float(out.get("max_norm", -1.0)):
        return (f"thumbnail left out: the step's thumbnails passed its budget of {out.get('budget')} bytes, and "
                f"the {out.get('count')} smallest-norm gradients keep their statistics only (Tracer(thumb_budget=...))")
    return "no values stored for this tensor (statistics only)"


def _slot(wire: Wire, kind: str, j: int, index: int | None, label: str, arrays: Mapping[int, TensorArrays],
          sample: int, max_side: int, plotly: bool = True, memo: dict[int, Any] | None = None) -> dict[str, Any]:
    t = tensor(wire, index)
    slot: dict[str, Any] = {"kind": kind, "slot": j, "label": label, "tensor": index, "shape": None, "dtype": None,
                            "title": label, "source": None, "view": None, "figure": None, "stats": [], "note": None}
    if t is None:
        slot["note"] = "no gradient (None): this input needs none, or nothing flowed here"
        return slot
    shape = list(t["shape"])
    rows = memo.get(index) if memo is not None and index is not None else None
    if rows is None:
        rows = stats_rows(t)
        if memo is not None and index is not None:
            memo[index] = rows
    slot.update(shape=shape, dtype=t["dtype"], stats=rows,
                title=f"{label} · {fmt_shape(shape)} {t['dtype']}".rstrip())
    entry = arrays.get(index) if index is not None else None
    values = _decode(entry["values"] if entry else None, "values")
    thumb = _decode(entry["thumb"] if entry else None, "thumb")
    exact = values is not None
    if values is not None:
        z, pad, words = view_2d(values, sample=sample, max_side=max_side)
        slot["source"] = "full values" + (", block means" if "block means" in words else "")
        slot["view"] = words
        shown = sample if len(shape) == 4 else 0
    elif thumb is not None:
        z = np.asarray(thumb, dtype=np.float64)
        pad = thumb_padding(shape, z)
        blocks = thumb_blocks(shape, z)
        whole = blocks == "1×1" and len(shape) != 4
        slot["source"] = ("thumbnail: every value (to bfloat16's precision)" if whole
                          else f"thumbnail: block means of {blocks} elements")
        slot["view"] = t["view"] or view_words(tuple(shape))
        if len(shape) == 4 and sample:
            slot["note"] = "the thumbnail shows sample 0 only; trace with tensors='full' to see other samples"
        shown = 0
    else:
        slot["note"] = _no_thumb_note(wire, t)
        return slot
    if z.size == 0:
        slot["note"] = "empty tensor"
        return slot
    if len(shape) == 4 and shape[0]:
        shown = min(max(shown, 0), shape[0] - 1)
    where = positions(shape, z, pad, exact=exact, sample=shown, words=plotly)
    if not plotly:  # the cells themselves, for a page that draws its own (the offline file: its own key)
        slot["grid"] = {"z": z, "pad": pad, "where": where}
        return slot
    slot["key"] = nonfinite_key(z, pad)
    slot["figure"] = heatmap_figure(z, f"{slot['title']}<br><sup>{slot['view']} · {slot['source']}</sup>", pad,
                                    where)
    return slot


def slot_of(wire: Wire, kind: str, j: int, index: int | None, label: str, arrays: Mapping[int, TensorArrays], *,
            sample: int = 0, max_side: int = 128) -> dict[str, Any]:
    """One gradient as the inspector shows it (heatmap, label, shape, statistics): the slot of
    `slot_figures`, for any tensor of the step (the module tab uses it for grad_input/grad_output)."""
    return _slot(wire, kind, j, index, label, arrays, sample, max_side)


def _output_label(node: WireNode, i: int, count: int) -> str:
    if node["name"] == ACCUMULATE:
        who = node["param"] or "the leaf tensor"
        return f"∂L/∂{who} → added to {who}.grad"
    return "∂L/∂output" if count == 1 else f"∂L/∂output {i}"


def _input_label(node: WireNode, j: int) -> str:
    labels = node["labels"]
    if j < len(labels):
        return str(labels[j])
    args = node["args"]
    return str(args[j]) if j < len(args) else f"input {j}"


def slot_figures(wire: Wire, node_id: int | str, arrays: Mapping[int, TensorArrays], *, sample: int = 0,
                 max_side: int = 128, plotly: bool = True, memo: dict[int, Any] | None = None) -> dict[str, Any]:
    """Everything the inspector shows for one node.

    `arrays`: `read_arrays(run, step, indices)` for the node's tensor indices (`node_tensors`);
    indices missing from it get statistics only. `sample`: which sample of a 4-D gradient to tile
    (full values only; thumbnails hold sample 0). Returns `{"node", "name", "explain",
    "grad_outputs": {"title", "slots"}, "grad_inputs": {"title", "slots"}}`; each slot has its
    label, shape, dtype, a `figure` (plotly dict, None without values), `source` ("full values" or
    "thumbnail: block means of …"), `view` (which 2-D view) and `stats` rows.
    `plotly=False`: no figure and no per-cell hover words, but the 2-D view's cells and where they sit
    (`grid`: `z`, `pad`, `where` from `grid.positions`), for the offline file, which draws its own. `memo`:
    each tensor's statistics rows by index, kept across calls (a tensor is two slots: an edge's ends).
    """
    k = node_index(node_id)
    node = wire["nodes"][k]
    go = node["go"] or []
    gi = node["gi"] or []
    return {
        "node": node_element(k), "name": node["name"], "explain": explain(wire, k),
        "grad_outputs": {"title": ARRIVING, "slots": [
            _slot(wire, "grad_outputs", i, idx, _output_label(node, i, len(go)), arrays, sample, max_side, plotly,
                  memo)
            for i, idx in enumerate(go)]},
        "grad_inputs": {"title": SENT, "slots": [
            _slot(wire, "grad_inputs", j, idx, _input_label(node, j), arrays, sample, max_side, plotly, memo)
            for j, idx in enumerate(gi)]},
    }


def node_tensors(wire: Wire, node_id: int | str) -> list[int]:
    """The tensor indices `slot_figures` needs for a node: what to pass to `read_arrays`."""
    node = wire["nodes"][node_index(node_id)]
    return sorted({i for i in (node["go"] or []) + (node["gi"] or []) if i is not None})


# ---------------------------------------------------------------------------- explain
def _shape_of(wire: Wire, index: int | None, fallback: Any) -> str:
    t = tensor(wire, index)
    return fmt_shape(t["shape"] if t is not None else fallback)


def explain(wire: Wire, node_id: int | str) -> str:
    """One line saying what this node computed in backward, with the real shapes."""
    k = node_index(node_id)
    node = wire["nodes"][k]
    go = node["go"] or []
    gi = node["gi"] or []
    out_shapes = node["out_shapes"]
    if node["name"] == ACCUMULATE:
        shape = _shape_of(wire, go[0] if go else None, out_shapes[0] if out_shapes else None)
        if node["param"]:
            return f"this is the parameter's .grad contribution: {node['param']} {shape}"
        return f"this is a leaf tensor's .grad contribution: a tensor {shape} that requires grad (not a parameter)"
    if node["order"] is None:
        return f"{node['name']} did not run in this step: no gradient reached it"
    received = ", ".join(
        f"∂L/∂output{'' if len(go) == 1 else f' {i}'} "
        f"{_shape_of(wire, idx, out_shapes[i] if i < len(out_shapes) else None)}"
        + ("" if idx is not None else " (none)") for i, idx in enumerate(go)) or "nothing"
    args = node["args"]
    in_shapes = node["in_shapes"]
    sent_parts = []
    for j, idx in enumerate(gi):
        arg = args[j] if j < len(args) else f"input {j}"
        if idx is None:
            sent_parts.append(f"nothing for {arg} (no gradient needed)")
        else:
            sent_parts.append(f"∂L/∂{arg} {_shape_of(wire, idx, in_shapes[j] if j < len(in_shapes) else None)}")
    sent = ", ".join(sent_parts) or "nothing"
    seed = any(k in (p["roots"]) for p in wire["passes"])
    return (f"grad_inputs[j] = J_jᵀ · grad_outputs: {node['name']} received {received}"
            + (" (the seed passed to backward)" if seed else "")
            + f" and sent {sent} (a vector-Jacobian product)")
