"""The 2-D view a thumbnail shows (NOTE [Thumbnail views] in tracer/summary/thumbnails.py): the tracer
draws thumbnails with it and the view titles heatmaps with it, so it lives with the schema."""

from __future__ import annotations

import math


def matrix_shape(shape: tuple[int, ...] | list[int]) -> tuple[int, int]:
    """(rows, cols) of the 2-D view of every rank but 4 (NOTE [Thumbnail views]): a scalar is 1×1,
    a vector a 1×n strip, anything else the leading dimensions flattened against the last."""
    r = len(shape)
    rows = 1 if r <= 1 else math.prod(shape[:-1])
    cols = 1 if r == 0 else int(shape[-1])
    return rows, cols


def thumbnail_view(shape: tuple[int, ...]) -> str:
    """Words for the 2-D view a thumbnail of this shape shows. See NOTE [Thumbnail views]."""
    r = len(shape)
    if r == 0:
        return "scalar"
    if r == 1:
        return f"strip 1×{shape[0]}"
    if r == 2:
        return f"rows {shape[0]} × cols {shape[1]}"
    if r == 3:
        return f"rows {shape[0]}·{shape[1]} (dim0·dim1) × cols {shape[2]}"
    if r == 4:
        return f"sample 0 of {shape[0]}: {shape[1]} channels as tiles of {shape[2]}×{shape[3]}"
    return f"rows {'·'.join(map(str, shape[:-1]))} × cols {shape[-1]}"
