"""A tensor as a 2-D grid of cells, the way a heatmap shows it (NOTE [Thumbnail views] in
tracer/summary/thumbnails.py): 1-D as a 1×n strip, 3-D as [a·b, c], 4-D as one sample's channels laid out as tiles,
and so on, so a full-values map and a thumbnail line up. `view_2d` makes the grid from full values,
`thumb_padding` / `thumb_blocks` describe a thumbnail's, and `positions` says which indices of the tensor
each cell holds (or averages)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gradscape.tracer.wire import matrix_shape, thumbnail_view


# ---------------------------------------------------------------------------- 2-D views
def _block_mean(v: np.ndarray, axis: int, out: int) -> np.ndarray:
    """Means of consecutive blocks along `axis` so at most `out` remain; the last block may be
    shorter. The same rule as the tracer's thumbnails (`tracer._summary._block_mean`)."""
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
        return np.zeros((0, 0)), np.zeros((0, 0), dtype=bool), view_words(tuple(x.shape))
    rows, cols = matrix_shape(x.shape)
    v = x.reshape(rows, cols)
    out = _block_mean(_block_mean(v, 0, max_side), 1, max_side)
    words = view_words(tuple(x.shape))
    if out.shape != v.shape:
        words += f" (block means of {math.ceil(rows / out.shape[0])}×{math.ceil(cols / out.shape[1])})"
    return out, np.zeros(out.shape, dtype=bool), words


def view_words(shape: tuple[int, ...]) -> str:
    """The same words the tracer gives its thumbnails (NOTE [Thumbnail views] in tracer/summary/thumbnails.py)."""
    return thumbnail_view(shape)


def thumb_blocks(shape: list[int], thumb: np.ndarray) -> str:
    """How many tensor elements each thumbnail cell averages, e.g. `2×12`."""
    r = len(shape)
    if r == 4 and shape[0] and shape[1]:
        gr, gc = _grid(shape[1])
        th, tw = max(1, thumb.shape[0] // gr), max(1, thumb.shape[1] // gc)
        return f"{math.ceil(shape[2] / th)}×{math.ceil(shape[3] / tw)}"
    rows, cols = matrix_shape(shape)
    tr, tc = max(thumb.shape[0], 1), max(thumb.shape[1], 1)
    return f"{math.ceil(rows / tr)}×{math.ceil(cols / tc)}"


def thumb_padding(shape: list[int], thumb: np.ndarray) -> np.ndarray:
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


def _tile_words(z: np.ndarray, pad: np.ndarray, c: int, gc: int, th: int, tw: int, ye: list[int], xe: list[int],
                exact: bool, sample: int) -> list[list[str]]:
    """Each cell's hover words of a 4-D gradient tiled one channel a tile (`positions`)."""
    text = []
    for i in range(z.shape[0]):
        line = []
        ti, ci = divmod(i, th)
        for j in range(z.shape[1]):
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
    return text


def positions(shape: list[int], z: np.ndarray, padding: np.ndarray | None, *, exact: bool,
              sample: int = 0, words: bool = True) -> dict[str, Any]:
    """Where each cell of a 2-D view `z` of a tensor of `shape` sits in the tensor.

    Returns plotly heatmap keys: `x`/`y` as cell edges in the tensor's own indices (edge i − 0.5,
    so an axis runs to the tensor's last row even when a cell averages several), `text` (per cell:
    which indices it holds or averages, and its value) and the axis titles. 4-D gradients are shown
    as tiles, one per channel; their cells name channel, rows and columns and the axes carry no
    index ticks (an index there would belong to no single channel). `words=False` leaves `text` None (the
    offline file draws no hover: `app.export.data`)."""
    rows_z, cols_z = z.shape
    pad = np.zeros(z.shape, dtype=bool) if padding is None else padding
    if len(shape) == 4 and shape[0] and shape[1]:
        n, c, h, w = shape
        gr, gc = _grid(c)
        th, tw = max(rows_z // gr, 1), max(cols_z // gc, 1)
        ye, xe = block_edges(h, th), block_edges(w, tw)
        text = _tile_words(z, pad, c, gc, th, tw, ye, xe, exact, sample) if words else None
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
    if (blocked or rank_words) and words:
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
