"""A kept step's summary arena, copied down to the thumbnails the step still shows.

NOTE [Arena compaction]
    The kernel writes each summary of a natively recorded step into the step's arena: its 8 statistics,
    then its thumbnail (NOTE [Arena thumbnails] in tracer/summary/bfloat16.py). When the thumbnail budget
    leaves pictures out (NOTE [Thumbnail budget] in tracer/summary/budget.py), their cells stay in the
    arena for as long as the step is kept, though nothing reads them again: a 100k-node step of an
    LSTMCell loop keeps 8 MiB of pictures under the default budget and held 106 MiB of arena for them.
    `compact` copies the rows that still have a picture into new arrays, each row's statistics and cells as
    they were, one chunk at a time (each old chunk is freed once its rows are copied, so the copy holds at
    most one chunk twice), and points the table's offsets at them.
    The table's statistics are its own copy (`TensorTable.raw`), so a row without a picture needs no place
    in the arena. What any reader gets (`thumb_of`, `thumb_stacks`) is unchanged, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

MIN_SAVING = 0.25  # compact only when it frees at least this share of the arena (the copy is not free)
BATCH = 4096  # rows copied at a time (the gathered rows pass through a temporary)


def compact(tt: Any, cells: np.ndarray) -> int:
    """Copy the arena rows of table `tt` that keep a picture into new chunks, one for each chunk of the arena;
    `cells`, the thumbnail cells of each row's plan (0 for none, and for Python's rows). Returns the bytes
    freed (0: left as it was)."""
    native = tt.plan >= 0
    cells = np.where(tt.evicted, 0, cells)  # (left out while recording: the arena holds their statistics only)
    words = 8 + (cells * np.where(tt.wide != 0, 4, 2) + 7) // 8  # the statistics, then the cells (in doubles)
    rows = np.flatnonzero(native & (cells > 0) & ~tt.no_thumb)
    if not tt.chunks or int(words[rows].sum()) > (1.0 - MIN_SAVING) * _written(tt, native, words):
        return 0
    for t in tt.made():  # a picture made as a view of the old arena would keep it alive
        if t.thumb is not None and t.thumb.base is not None:
            t.thumb = t.thumb.copy()
    old = sum(c.nbytes for c in tt.chunks)
    off = np.zeros(len(tt.plan), np.int64)
    chunk = tt.chunk[rows].astype(np.int64)
    for c in range(len(tt.chunks)):  # chunk by chunk, each freed once copied: a chunk's worth held twice at most
        tt.chunks[c] = _copied(tt.chunks[c], rows[chunk == c], tt.off, words, off)
    tt.off = off
    return old - sum(c.nbytes for c in tt.chunks)


def _written(tt: Any, native: np.ndarray, words: np.ndarray) -> int:
    """The doubles the kernel wrote into the arena (a chunk's unwritten end is not counted): each block once, though
    views share one (NOTE [Views share a buffer] in tracer/summary/summariser.py). Counted once a row, a 40-micro-batch
    GPT step's shared blocks made its arena look a third larger, and it was copied each step (6-9 ms) to free 11%."""
    at = np.flatnonzero(native)
    block = (tt.chunk[at].astype(np.int64) << 40) | tt.off[at]
    order = np.lexsort((-words[at], block))  # each block's rows together, the widest first
    first = np.ones(len(order), bool)
    first[1:] = block[order[1:]] != block[order[:-1]]
    return int(words[at][order][first].sum())


def _copied(src: np.ndarray, rows: np.ndarray, at: np.ndarray, words: np.ndarray, off: np.ndarray) -> np.ndarray:
    """The rows `rows` of arena chunk `src` (each `words[k]` doubles from `at[k]`) in a new array; their new
    offsets are written into `off`."""
    w = words[rows]
    if not len(rows):
        return np.empty(0, np.float64)
    order = np.argsort(w, kind="stable")  # rows of one length are copied in one gather
    rows, w = rows[order], w[order]
    off[rows] = np.cumsum(w) - w
    out = np.empty(int(w.sum()), np.float64)
    bounds = np.flatnonzero(np.diff(w)) + 1
    for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), len(rows)]):
        n, base = int(w[a]), int(off[rows[a]])
        windows = sliding_window_view(src, n)  # a view: row i is the n doubles from double i
        for s in range(a, b, BATCH):  # (`np.take` would copy the whole strided view first)
            e = min(b, s + BATCH)
            out[base + (s - a) * n:base + (e - a) * n].reshape(e - s, n)[:] = windows[at[rows[s:e]]]
    return out
