"""The inspector's heatmaps: every gradient slot of one node, with its label, shape and statistics.

A node shows what ARRIVED (`grad_outputs`, ∂L/∂ its forward outputs, from the loss side) and what
it SENT ON (`grad_inputs`, ∂L/∂ its forward inputs, one per slot, labelled `mat2 → fc2.weight
(transposed)`). Gradients are signed, so the colour scale diverges at 0 and is symmetric: the same
colour intensity means the same magnitude on either side.

Values come from the store's `read_arrays(run, step, indices)`: full values when the tracer kept
them (`tensors="full"`), else the thumbnail. Both are shown through the same 2-D view of the
tensor (NOTE [Thumbnail views] in `tracer.summary.thumbnails`): 1-D as a 1×n strip, 3-D as [a·b, c], 4-D as
one sample's channels laid out as tiles, and so on, so a full-values map and a thumbnail line up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from gradscape.app.view._wire import (
    ACCUMULATE,
    Wire,
    fmt_num,
    fmt_shape,
    node_index,
    numel,
    stat,
    tensor,
)
from gradscape.tracer.wire import (
    TensorArrays,
    WireArray,
    WireNode,
    WireTensor,
    decode_array,
    matrix_shape,
    thumbnail_view,
)

DIVERGING = "RdBu_r"  # blue < 0 < red, white at 0
NONFINITE_COLORS = {1: "#000000", 2: "#ff00ff", 3: "#00c000"}  # NaN, +Inf, -Inf cells drawn over the map
ARRIVING = "Arriving: grad_outputs (∂L/∂ outputs)"
SENT = "Sent on: grad_inputs (∂L/∂ inputs)"


# ---------------------------------------------------------------------------- 2-D views
def _block_mean(v: np.ndarray, axis: int, out: int) -> np.ndarray:
    """Means of consecutive blocks along `axis` so at most `out` remain; the last block may be
    shorter. The same rule as the tracer's thumbnails (`tracer.summary.thumbnails._block_mean`)."""
    n = v.shape[axis]
    if n <= out:
        return v
    k = math.ceil(n / out)
    full = (n // k) * k
    head = np.take(v, np.arange(full), axis=axis)
    shape = list(v.shape)
    shape[axis:axis + 1] = [n // k, k]
    parts = [head.reshape(shape).mean(axis=axis + 1)]
    if full < n:
        parts.append(np.take(v, np.arange(full, n), axis=axis).mean(axis=axis, keepdims=True))
    return np.concatenate(parts, axis=axis) if len(parts) > 1 else parts[0]


def _grid(channels: int) -> tuple[int, int]:
    cols = math.ceil(math.sqrt(channels))
    return math.ceil(channels / cols), cols


def view_2d(values: np.ndarray, *, sample: int = 0, max_side: int = 128) -> tuple[np.ndarray, np.ndarray, str]:
    """(2-D array, mask of padding cells, words for the view) of a full tensor.

    Follows NOTE [Thumbnail views]; a view larger than `max_side` on a side is block-averaged
    (per tile for 4-D) so a figure stays a few hundred kB.
    """
    x = np.asarray(values, dtype=np.float64)
    r = x.ndim
    if r == 4 and x.shape[0] > 0 and x.shape[1] > 0:
        n, c, h, w = x.shape
        s = min(max(sample, 0), n - 1)
        gr, gc = _grid(c)
        th, tw = max(1, min(h, max_side // gr)), max(1, min(w, max_side // gc))
        tiles = _block_mean(_block_mean(x[s], 1, th), 2, tw)
        th, tw = tiles.shape[1], tiles.shape[2]
        pad = gr * gc - c
        if pad:
            tiles = np.concatenate([tiles, np.full((pad, th, tw), np.nan)])
        grid = tiles.reshape(gr, gc, th, tw).transpose(0, 2, 1, 3).reshape(gr * th, gc * tw)
        mask = np.zeros((gr * gc, th, tw), dtype=bool)
        mask[c:] = True
        mask = mask.reshape(gr, gc, th, tw).transpose(0, 2, 1, 3).reshape(gr * th, gc * tw)
        words = f"sample {s} of {n}: {c} channels as tiles of {h}×{w}"
        if (th, tw) != (h, w):
            words += f" (block means of {math.ceil(h / th)}×{math.ceil(w / tw)})"
        return grid, mask, words
    if x.size == 0:
        return np.zeros((0, 0)), np.zeros((0, 0), dtype=bool), _view_words(tuple(x.shape))
    rows, cols = matrix_shape(x.shape)
    v = x.reshape(rows, cols)
    out = _block_mean(_block_mean(v, 0, max_side), 1, max_side)
    words = _view_words(tuple(x.shape))
    if out.shape != v.shape:
        words += f" (block means of {math.ceil(rows / out.shape[0])}×{math.ceil(cols / out.shape[1])})"
    return out, np.zeros(out.shape, dtype=bool), words


def _view_words(shape: tuple[int, ...]) -> str:
    """The same words the tracer gives its thumbnails (NOTE [Thumbnail views] in tracer/summary/thumbnails.py)."""
    return thumbnail_view(shape)


def _thumb_blocks(shape: list[int], thumb: np.ndarray) -> str:
    """How many tensor elements each thumbnail cell averages, e.g. `2×12`."""
    r = len(shape)
    if r == 4 and shape[0] and shape[1]:
        gr, gc = _grid(shape[1])
        th, tw = max(1, thumb.shape[0] // gr), max(1, thumb.shape[1] // gc)
        return f"{math.ceil(shape[2] / th)}×{math.ceil(shape[3] / tw)}"
    rows, cols = matrix_shape(shape)
    tr, tc = max(thumb.shape[0], 1), max(thumb.shape[1], 1)
    return f"{math.ceil(rows / tr)}×{math.ceil(cols / tc)}"


def _thumb_padding(shape: list[int], thumb: np.ndarray) -> np.ndarray:
    mask = np.zeros(thumb.shape, dtype=bool)
    if len(shape) == 4 and shape[0] and shape[1]:
        gr, gc = _grid(shape[1])
        th, tw = thumb.shape[0] // gr, thumb.shape[1] // gc
        for k in range(shape[1], gr * gc):
            i, j = divmod(k, gc)
            mask[i * th:(i + 1) * th, j * tw:(j + 1) * tw] = True
    return mask


# ---------------------------------------------------------------------------- positions
def block_edges(n: int, cells: int) -> list[int]:
    """Where the `cells` block means of `n` consecutive elements start, plus `n` at the end: the
    tensor indices behind each cell. Blocks hold k = ceil(n / cells) elements (the thumbnail and
    `view_2d` rule), the last one whatever is left, so its range is honestly shorter."""
    if cells <= 0 or n <= cells:
        return list(range(n + 1))
    k = math.ceil(n / cells)
    while k > 1 and math.ceil(n / (k - 1)) == cells:  # the smallest block size that gives `cells` blocks
        k -= 1
    return [min(i * k, n) for i in range(cells)] + [n]


def _span(a: int, b: int) -> str:
    """Indices a..b-1 in words: `5` or `2–3`."""
    return str(a) if b - a <= 1 else f"{a}–{b - 1}"


def _axis_words(what: str, a: int, b: int) -> str:
    """`row 5` or `rows 2–3`."""
    return f"{what} {a}" if b - a <= 1 else f"{what}s {a}–{b - 1}"


def _row_words(shape: list[int], a: int, b: int) -> str:
    """Rows a..b-1 of the 2-D view; for 3-D and above also the leading indices they flatten."""
    words = f"row {a}" if b - a <= 1 else f"rows {a}–{b - 1}"
    lead = shape[:-1]
    if len(lead) >= 2:
        first = np.unravel_index(a, lead)
        last = np.unravel_index(b - 1, lead)
        multi = "[" + ", ".join(map(str, first)) + ", :]"
        if b - a > 1:
            multi += "…[" + ", ".join(map(str, last)) + ", :]"
        words += f" = {multi}"
    return words


def _fmt_value(v: float, exact: bool) -> str:
    if math.isnan(v):
        return "NaN"
    return f"{v:.9g}" if exact else f"{v:.4g}"


def positions(shape: list[int], z: np.ndarray, padding: np.ndarray | None, *, exact: bool,
              sample: int = 0) -> dict[str, Any]:
    """Where each cell of a 2-D view `z` of a tensor of `shape` sits in the tensor.

    Returns plotly heatmap keys: `x`/`y` as cell edges in the tensor's own indices (edge i − 0.5,
    so an axis runs to the tensor's last row even when a cell averages several), `text` (per cell:
    which indices it holds or averages, and its value) and the axis titles. 4-D gradients are shown
    as tiles, one per channel; their cells name channel, rows and columns and the axes carry no
    index ticks (an index there would belong to no single channel)."""
    rows_z, cols_z = z.shape
    pad = np.zeros(z.shape, dtype=bool) if padding is None else padding
    if len(shape) == 4 and shape[0] and shape[1]:
        n, c, h, w = shape
        gr, gc = _grid(c)
        th, tw = max(rows_z // gr, 1), max(cols_z // gc, 1)
        ye, xe = block_edges(h, th), block_edges(w, tw)
        text = []
        for i in range(rows_z):
            line = []
            ti, ci = divmod(i, th)
            for j in range(cols_z):
                tj, cj = divmod(j, tw)
                ch = ti * gc + tj
                if pad[i, j] or ch >= c:
                    line.append("no channel here (padding)")
                    continue
                count = (ye[ci + 1] - ye[ci]) * (xe[cj + 1] - xe[cj])
                where = f"sample {sample}, channel {ch}, {_axis_words('row', ye[ci], ye[ci + 1])}, " \
                        f"{_axis_words('col', xe[cj], xe[cj + 1])}"
                what = "" if count == 1 else f" (mean of {count})"
                line.append(f"{where}{what}<br>{_fmt_value(float(z[i, j]), exact and count == 1)}")
            text.append(line)
        return {"text": text, "x": None, "y": None, "blocked": th < h or tw < w,
                "x_title": f"{gc} tiles across, each {w} cols", "y_title": f"{gr} tiles down, each {h} rows",
                "ticks": False}
    rows, cols = matrix_shape(shape)
    ye, xe = block_edges(rows, rows_z), block_edges(cols, cols_z)
    blocked = rows_z < rows or cols_z < cols
    rank_words = len(shape) >= 3
    out: dict[str, Any] = {"blocked": blocked, "ticks": True, "x": None, "y": None, "text": None,
                           "x_title": "col" if len(shape) <= 1 else f"col (dim {len(shape) - 1})",
                           "y_title": "row" if len(shape) <= 2 else
                           "row (dims " + "·".join(map(str, range(len(shape) - 1))) + " flattened)"}
    if blocked:
        out["y"] = [e - 0.5 for e in ye]
        out["x"] = [e - 0.5 for e in xe]
    if blocked or rank_words:
        row_words = [_row_words(list(shape), ye[i], ye[i + 1]) for i in range(rows_z)]
        col_words = [_axis_words("col", xe[j], xe[j + 1]) for j in range(cols_z)]
        text = []
        for i in range(rows_z):
            line = []
            for j in range(cols_z):
                count = (ye[i + 1] - ye[i]) * (xe[j + 1] - xe[j])
                what = "" if count == 1 else f": mean of {count} elements"
                line.append(f"{row_words[i]}, {col_words[j]}{what}<br>"
                            f"{_fmt_value(float(z[i, j]), exact and count == 1)}")
            text.append(line)
        out["text"] = text
    return out


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
            text = "—" if value is None else f"{value:.1f}%"
        else:
            value = stat(t, name)
            text = str(int(value)) if name in ("nan", "inf") and value is not None else fmt_num(value)
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
          sample: int, max_side: int) -> dict[str, Any]:
    t = tensor(wire, index)
    slot: dict[str, Any] = {"kind": kind, "slot": j, "label": label, "tensor": index, "shape": None, "dtype": None,
                            "title": label, "source": None, "view": None, "figure": None, "stats": [], "note": None}
    if t is None:
        slot["note"] = "no gradient (None): this input needs none, or nothing flowed here"
        return slot
    shape = list(t["shape"])
    slot.update(shape=shape, dtype=t["dtype"], stats=stats_rows(t),
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
        pad = _thumb_padding(shape, z)
        blocks = _thumb_blocks(shape, z)
        whole = blocks == "1×1" and len(shape) != 4
        slot["source"] = ("thumbnail: every value (as float32)" if whole
                          else f"thumbnail: block means of {blocks} elements")
        slot["view"] = t["view"] or _view_words(tuple(shape))
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
    where = positions(shape, z, pad, exact=exact, sample=shown)
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
                 max_side: int = 128) -> dict[str, Any]:
    """Everything the inspector shows for one node.

    `arrays`: `read_arrays(run, step, indices)` for the node's tensor indices (`node_tensors`);
    indices missing from it get statistics only. `sample`: which sample of a 4-D gradient to tile
    (full values only; thumbnails hold sample 0). Returns `{"node", "name", "explain",
    "grad_outputs": {"title", "slots"}, "grad_inputs": {"title", "slots"}}`; each slot has its
    label, shape, dtype, a `figure` (plotly dict, None without values), `source` ("full values" or
    "thumbnail: block means of …"), `view` (which 2-D view) and `stats` rows.
    """
    k = node_index(node_id)
    node = wire["nodes"][k]
    go = node["go"] or []
    gi = node["gi"] or []
    return {
        "node": f"n{k}", "name": node["name"], "explain": explain(wire, k),
        "grad_outputs": {"title": ARRIVING, "slots": [
            _slot(wire, "grad_outputs", i, idx, _output_label(node, i, len(go)), arrays, sample, max_side)
            for i, idx in enumerate(go)]},
        "grad_inputs": {"title": SENT, "slots": [
            _slot(wire, "grad_inputs", j, idx, _input_label(node, j), arrays, sample, max_side)
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
