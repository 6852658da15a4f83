"""A natively recorded step's thumbnails gathered from the summary arena with numpy, by shape, for the store.

NOTE [Thumbnail stacks]
    The trace file keeps each thumbnail quantised, shape by shape, with repeats stored once (NOTE [Compact
    thumbnails] in tracer/wire/compact.py), which works on one (n, rows, cols) stack per shape. The kernel
    wrote every thumbnail into the step's arena at a known offset, in bfloat16 (NOTE [Arena thumbnails] in
    tracer/summary/bfloat16.py), with its plan's shape; `thumb_stacks` gathers each plan's thumbnails with
    one fancy index rather than making a view of each (`TensorTable.thumb_of`, which a 100k-node step
    called 176k times for 0.1 s) and stacking them again. A stack holds the same float32 values as
    `thumb_of` gives (a transposed plan's thumbnails are made contiguous, as `thumb_of` makes them), so
    what is stored does not change (tests/test_store_size.py holds the two equal).
"""

from __future__ import annotations

import numpy as np

from gradscape.tracer.record.tensor_table import TensorTable
from gradscape.tracer.summary import bfloat16
from gradscape.tracer.summary.fastpath import KERNEL_PLANS

Stacks = dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]]  # shape -> (positions ascending, (n, *shape) stack)


def thumb_stacks(tt: TensorTable, order: np.ndarray, skip: np.ndarray) -> Stacks:
    """The thumbnails the kernel made of table rows `order` (position i is row `order[i]`), by shape: what
    `tt.thumb_of(order[i])` gives, for every position not in `skip` (a bool per position: its thumbnail is
    taken from its `TensorTrace` instead) that has one."""
    n_chunks = len(tt.chunks)
    if not len(order) or not n_chunks:
        return {}
    plan = tt.plan[order].astype(np.int64)
    made = np.array([q.th_shape is not None for q in KERNEL_PLANS] + [False])  # the last: plan -1 (Python's)
    has = made[plan] & ~tt.no_thumb[order] & ~tt.evicted[order] & ~skip
    pos = np.flatnonzero(has)
    if not len(pos):
        return {}
    rows = order[pos]
    keys = (plan[pos] * n_chunks + tt.chunk[rows].astype(np.int64)) * 2 + tt.wide[rows]
    parts: dict[tuple[int, ...], list[tuple[np.ndarray, np.ndarray]]] = {}
    for key in np.unique(keys).tolist():
        (p, c), wide = divmod(key >> 1, n_chunks), key & 1
        sel = keys == key
        h, w = KERNEL_PLANS[p].th_shape  # type: ignore[misc]
        start = (tt.off[rows[sel]].astype(np.int64) + 8) * (2 if wide else 4)  # after the 8 statistics (doubles)
        cells = tt.chunks[c].view(np.float32 if wide else np.uint16)[start[:, None] + np.arange(h * w)]
        stack = (cells if wide else bfloat16.widen(cells)).reshape(len(start), h, w)
        if KERNEL_PLANS[p].transposed:
            stack = np.ascontiguousarray(stack.transpose(0, 2, 1))
        parts.setdefault(stack.shape[1:], []).append((pos[sel], stack))
    out: Stacks = {}
    for shape, got in parts.items():
        at = np.concatenate([a for a, _ in got])
        stack = np.concatenate([s for _, s in got])
        by_pos = np.argsort(at, kind="stable")
        out[shape] = (at[by_pos], stack[by_pos])
    return out
