"""Counting the edge crossings of a layered drawing (what the ordering minimises, and what tests and
bench/layout.py report)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["count_crossings"]


def count_crossings(layer: Sequence[int], x: Sequence[float], pairs: Sequence[tuple[int, int]]) -> int:
    """Edge crossings of the drawing with straight edges: pairs of edges that cross between layers.

    An edge spanning several layers is cut at every layer it passes (x interpolated, as drawn), and
    in each gap between two layers the crossings are the inversions between the order at the top
    and the order at the bottom; edges that share an end do not cross. O(s log² s) in numpy, s =
    the sum of the edges' layer spans.
    """
    if not pairs:
        return 0
    p = np.asarray(pairs, dtype=np.int64)
    lay = np.asarray(layer, dtype=np.int64)
    xs = np.asarray(x, dtype=np.float64)
    a, b = p[:, 0], p[:, 1]
    swap = lay[a] > lay[b]
    top, bot = np.where(swap, b, a), np.where(swap, a, b)
    t0, t1 = lay[top], lay[bot]
    keep = t1 > t0
    top, bot, t0, t1 = top[keep], bot[keep], t0[keep], t1[keep]
    if top.size < 2:
        return 0
    span = t1 - t0
    edge = np.repeat(np.arange(top.size), span)
    step = np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)
    x0, x1 = xs[top][edge], xs[bot][edge]
    frac = span[edge].astype(np.float64)
    gap = t0[edge] + step
    upper = x0 + (x1 - x0) * (step / frac)
    lower = x0 + (x1 - x0) * ((step + 1) / frac)
    order = np.lexsort((lower, upper, gap))
    gap, lower = gap[order], lower[order]
    key = np.lexsort((lower, gap))
    rank = np.empty(key.size, dtype=np.int64)
    g_sorted, l_sorted = gap[key], lower[key]
    new = np.ones(key.size, dtype=bool)
    new[1:] = (g_sorted[1:] != g_sorted[:-1]) | (l_sorted[1:] != l_sorted[:-1])
    rank[key] = np.cumsum(new) - 1
    return _inversions(rank)


def _inversions(r: np.ndarray) -> int:
    """Pairs i < j with r[i] > r[j], by a bottom-up merge sort done with numpy searches."""
    n = r.size
    k = int(r.max()) + 1 if n else 1
    a = r.astype(np.int64)
    pos = np.arange(n, dtype=np.int64)
    total, s = 0, 1
    while s < n:
        pair = pos // (2 * s)
        right = (pos // s) % 2 == 1
        g = pair * k + a
        left = g[~right]  # sorted: each block is sorted and blocks are offset by pair * k
        pr = pair[right]
        hi = np.searchsorted(left, (pr + 1) * k, side="left")
        lo = np.searchsorted(left, g[right], side="right")
        total += int((hi - lo).sum())
        g.sort(kind="stable")
        a = g - pair * k
        s *= 2
    return total
