"""Node positions for the graph view, computed in Python (cytoscape's `preset` layout).

dagre in the browser is O(n²) here and blocks the page for ~40 s at 2,000 nodes (STACK.md §3.2),
so positions are computed on the server, on the (possibly collapsed) graph, in a few steps:

1. Layers: the longest path from the loss root (`topological generations` of the edges src → dst of
   `wire["edges"]`), so the root is at the top and every edge points down. Folding a module can
   close a cycle (a module called twice with ops in between); then the earliest remaining element
   is placed anyway and the edges that close the cycle point up (`"up": true`).
2. Order within layers: barycenter sweeps (down, up, …) that keep the order with the fewest edge
   crossings. Elements of one module stay side by side in every layer (sorted by module first, then
   by barycenter), so a transformer block reads as a block and module boxes do not interleave.
3. x: each element moves towards the mean x of its neighbours while keeping its order and a
   minimum gap (wider between modules), so chains run straight down.

Everything is deterministic (no randomness, ties broken by node id order) and linear-ish: a
10,000-node graph lays out in a fraction of a second.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from app.view._bk import bk_coordinates
from app.view._wire import Wire, prefixes
from app.view.collapse import collapse_graph, default_collapse, normalise

__all__ = ["count_crossings", "default_collapse", "layout_graph"]

Group = tuple[str, ...]


def layout_graph(wire: Wire, collapsed: Iterable[str] | None = None, *, sweeps: int = 6, dx: float = 110.0,
                 dy: float = 70.0, module_gap: float = 0.5, max_visible: int = 300) -> dict[str, Any]:
    """Positions of every drawn element, as JSON-ready data for `elements.cytoscape_elements`.

    `collapsed`: module prefixes to fold; None means `default_collapse(wire, max_visible)` and an
    empty set draws every node. `sweeps=0` keeps the insertion (node id) order: the baseline the
    crossing reduction is measured against.

    Returns `{"collapsed": [...], "nodes": {element: {"x", "y", "layer", "parent", "members"?}},
    "boxes": {module: parent module | None}, "edges": [{"id", "source", "target", "slots", "up",
    "bends"}], "hidden": {node id: module element}, "layers", "crossings", "width", "height"}`.
    An edge's `slots` are the `[src, dst, slot]` wire edges it stands for; `bends` are the points
    `[x, y]` a long edge is routed through (empty for an edge between neighbouring layers).
    """
    folded = default_collapse(wire, max_visible) if collapsed is None else normalise(wire, collapsed)
    vg = collapse_graph(wire, folded, normalised=True)
    index = {e: i for i, e in enumerate(vg.elements)}
    n = len(vg.elements)
    pairs = [(index[a], index[b]) for a, b in vg.edges]
    layer = _layers(n, pairs)
    groups: list[Group] = [prefixes(vg.parent[e]) for e in vg.elements]
    proper = _Proper(layer, groups, pairs)
    rows: list[list[int]] = [[] for _ in range(max(layer, default=-1) + 1)]
    for v in range(len(proper.layer)):
        rows[proper.layer[v]].append(v)
    rows = _order(rows, proper, sweeps)
    x = _place_x(rows, proper, n, dx, dx * module_gap)
    lo = min(x, default=0.0)
    nodes: dict[str, dict[str, Any]] = {}
    for v, eid in enumerate(vg.elements):
        entry: dict[str, Any] = {"x": round(x[v] - lo, 2), "y": layer[v] * dy, "layer": layer[v],
                                 "parent": vg.parent[eid]}
        if eid in vg.members:
            entry["members"] = vg.members[eid]
        nodes[eid] = entry
    edges = []
    for k, ((a, b), slots) in enumerate(vg.edges.items()):
        route = proper.routes[k]
        bends = [[round(x[d] - lo, 2), proper.layer[d] * dy] for d in _corners(route, x)]
        edges.append({"id": f"e:{a}>{b}", "source": a, "target": b, "slots": [list(s) for s in slots],
                      "up": layer[index[a]] >= layer[index[b]], "bends": bends})
    hidden = {str(i): e for e, ids in vg.members.items() for i in ids}
    return {"collapsed": sorted(folded), "nodes": nodes, "boxes": dict(vg.boxes), "edges": edges,
            "hidden": hidden, "layers": len(rows), "crossings": count_crossings(proper.layer, x, proper.pairs),
            "width": max(x, default=0.0) - lo, "height": (len(rows) - 1) * dy if rows else 0.0}


class _Proper:
    """The layered graph with a dummy vertex wherever an edge passes a layer (Sugiyama's "proper"
    graph), so long edges take part in ordering and get a lane of their own.

    Vertices 0..n-1 are the drawn elements, the rest are dummies. `routes[k]` is the vertex path
    of the k-th edge from its upper to its lower end.
    """

    def __init__(self, layer: list[int], groups: list[Group], pairs: Sequence[tuple[int, int]]) -> None:
        self.layer = list(layer)
        self.groups = list(groups)
        n = len(layer)
        self.above: list[list[int]] = [[] for _ in range(n)]
        self.below: list[list[int]] = [[] for _ in range(n)]
        self.pairs: list[tuple[int, int]] = []
        self.routes: list[list[int]] = []
        for a, b in pairs:
            top, bot = (a, b) if layer[a] <= layer[b] else (b, a)
            if layer[top] == layer[bot]:  # only inside a folded cycle: no lane
                self.routes.append([top, bot])
                continue
            shared = _common(groups[top], groups[bot])
            route = [top]
            for k in range(layer[top] + 1, layer[bot]):
                route.append(self._add(k, shared))
            route.append(bot)
            for u, v in zip(route, route[1:]):
                self.below[u].append(v)
                self.above[v].append(u)
                self.pairs.append((u, v))
            self.routes.append(route)

    def _add(self, layer: int, group: Group) -> int:
        self.layer.append(layer)
        self.groups.append(group)
        self.above.append([])
        self.below.append([])
        return len(self.layer) - 1


def _common(a: Group, b: Group) -> Group:
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    return a[:k]


def _corners(route: list[int], x: list[float]) -> list[int]:
    """The dummies of a route where its line bends (straight runs need no point)."""
    out = []
    for i in range(1, len(route) - 1):
        p, c, q = x[route[i - 1]], x[route[i]], x[route[i + 1]]
        if abs((c - p) - (q - c)) > 1e-6:
            out.append(route[i])
    return out


# ---------------------------------------------------------------------------- layers
def _layers(n: int, pairs: Sequence[tuple[int, int]]) -> list[int]:
    """Longest-path layer of each element (Kahn's algorithm); cycles are cut at the earliest element."""
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    for a, b in pairs:
        succ[a].append(b)
        pred[b].append(a)
    indeg = [len(p) for p in pred]
    layer = [-1] * n
    ready = deque(v for v in range(n) if indeg[v] == 0)
    placed, forced = 0, 0
    while placed < n:
        if not ready:  # only a cycle is left: place its earliest element, its back edges point up
            while layer[forced] != -1:
                forced += 1
            ready.append(forced)
        v = ready.popleft()
        if layer[v] != -1:
            continue
        layer[v] = max((layer[u] + 1 for u in pred[v] if layer[u] >= 0), default=0)
        placed += 1
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return layer


# ---------------------------------------------------------------------------- order
def _order(rows: list[list[int]], g: _Proper, sweeps: int) -> list[list[int]]:
    """Barycenter sweeps, alternating down and up; returns the order with the fewest crossings."""
    pos = [0.0] * len(g.layer)

    def set_positions(row: list[int]) -> None:
        mid = (len(row) - 1) / 2
        for i, v in enumerate(row):
            pos[v] = i - mid

    rows = [_group_sort(row, {v: float(i) for i, v in enumerate(row)}, g.groups) for row in rows]
    if sweeps <= 0:
        return rows
    for row in rows:
        set_positions(row)
    best = [list(r) for r in rows]
    best_cross = count_crossings(g.layer, pos, g.pairs)
    for s in range(sweeps):
        down = s % 2 == 0
        for k in (range(len(rows)) if down else range(len(rows) - 1, -1, -1)):
            bary: dict[int, float] = {}
            for v in rows[k]:
                nb = g.above[v] if down else g.below[v]
                bary[v] = sum(pos[u] for u in nb) / len(nb) if nb else pos[v]
            rows[k] = _group_sort(rows[k], bary, g.groups)
            set_positions(rows[k])
        cross = count_crossings(g.layer, pos, g.pairs)
        if cross < best_cross:
            best, best_cross = [list(r) for r in rows], cross
        if best_cross == 0:
            break
    return best


def _group_sort(row: list[int], bary: dict[int, float], groups: list[Group], depth: int = 0) -> list[int]:
    """Sort a layer by barycenter, keeping the elements of one module contiguous (recursively)."""
    if len(row) < 2:
        return list(row)
    if all(len(groups[v]) <= depth for v in row):  # no module left to keep together
        return sorted(row, key=bary.__getitem__)
    units: dict[Any, list[int]] = {}
    for v in row:
        grp = groups[v]
        units.setdefault(grp[depth] if len(grp) > depth else (v,), []).append(v)
    scored = []
    for rank, (key, vs) in enumerate(units.items()):
        scored.append((sum(bary[v] for v in vs) / len(vs), rank, key, vs))
    scored.sort(key=lambda t: (t[0], t[1]))
    out: list[int] = []
    for _, _, key, vs in scored:
        out.extend(vs if isinstance(key, tuple) else _group_sort(vs, bary, groups, depth + 1))
    return out


# ---------------------------------------------------------------------------- x
def _place_x(rows: list[list[int]], g: _Proper, n_real: int, dx: float, extra: float) -> list[float]:
    """Brandes–Köpf coordinates (see `app.view._bk`) with the gaps of `_gap`."""
    dummy = [v >= n_real for v in range(len(g.layer))]

    def gap(a: int, b: int) -> float:
        # lanes of long edges pack tighter than nodes; modules keep a margin so boxes do not touch
        base = dx / 2 if dummy[a] or dummy[b] else dx
        return base + (extra if g.groups[a] != g.groups[b] else 0.0)

    return bk_coordinates(rows, g.above, g.below, dummy, gap)


# ---------------------------------------------------------------------------- crossings
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
