"""The order of the elements in every layer: crossing reduction (step 2 of `app.view.layout`)."""

from __future__ import annotations

from gradscape.app.view.crossings import count_crossings
from gradscape.app.view.layered import Group, ProperGraph, common

__all__ = ["order_layers"]


def order_layers(rows: list[list[int]], g: ProperGraph, sweeps: int) -> list[list[int]]:
    """The order of every layer with the fewest crossings found.

    Barycenter sweeps (alternating down and up) then neighbour swaps, from two starting orders:
    depth-first in slot order, and node id order (only for graphs below `_TWO_STARTS` vertices,
    where it is cheap). `sweeps=0` returns node id order untouched: the baseline.
    """
    if sweeps <= 0:
        return rows
    rank = _dfs_rank(g)
    starts = [[_group_sort(r, {v: float(rank[v]) for v in r}, g.groups) if len(r) > 1 else r for r in rows]]
    if len(g.layer) < _TWO_STARTS:
        starts.append([_group_sort(r, {v: float(i) for i, v in enumerate(r)}, g.groups) for r in rows])
    best: list[list[int]] = []
    best_cross = -1
    for start in starts:
        order, cross = _sweep(start, g, sweeps)
        if best_cross < 0 or cross < best_cross:
            best, best_cross = order, cross
        if best_cross == 0:
            break
    return best


_TWO_STARTS = 3000


def _sweep(rows: list[list[int]], g: ProperGraph, sweeps: int) -> tuple[list[list[int]], int]:
    pos = [0.0] * len(g.layer)

    def set_positions(row: list[int]) -> None:
        mid = (len(row) - 1) / 2
        for i, v in enumerate(row):
            pos[v] = i - mid

    for row in rows:
        set_positions(row)
    best = [list(r) for r in rows]
    best_cross = count_crossings(g.layer, pos, g.pairs)
    for s in range(sweeps):
        if best_cross == 0:
            return best, 0
        down = s % 2 == 0
        near = g.above if down else g.below
        for k in (range(len(rows)) if down else range(len(rows) - 1, -1, -1)):
            row = rows[k]
            if len(row) < 2:
                continue
            bary: dict[int, float] = {}
            for v in row:
                nb = near[v]
                bary[v] = sum([pos[u] for u in nb]) / len(nb) if nb else pos[v]
            rows[k] = _group_sort(row, bary, g.groups)
            set_positions(rows[k])
        cross = count_crossings(g.layer, pos, g.pairs)
        if cross < best_cross:
            best, best_cross = [list(r) for r in rows], cross
    if best_cross:
        for row in best:
            set_positions(row)
        if _transpose(best, g, pos):
            best_cross = count_crossings(g.layer, pos, g.pairs)
    return best, best_cross


def _transpose(rows: list[list[int]], g: ProperGraph, pos: list[float], rounds: int = 4) -> bool:
    """Swap neighbours in a layer while that removes crossings (Graphviz dot's `transpose`): the
    local fix-up barycenters miss, e.g. a parameter leaf on the wrong side of a residual lane.
    A swap may not split a module: two vertices of different modules are swapped only when each is
    alone of its module in the layer. True when anything moved."""
    swapped = False
    for _ in range(rounds):
        improved = False
        for row in rows:
            for i in range(len(row) - 1):
                u, v = row[i], row[i + 1]
                if not _swappable(row, i, g.groups):
                    continue
                if _pair_crossings(v, u, g, pos) < _pair_crossings(u, v, g, pos):
                    row[i], row[i + 1] = v, u
                    pos[u], pos[v] = pos[v], pos[u]
                    improved = swapped = True
        if not improved:
            break
    return swapped


def _swappable(row: list[int], i: int, groups: list[Group]) -> bool:
    gu, gv = groups[row[i]], groups[row[i + 1]]
    if gu == gv:
        return True
    c = len(common(gu, gv))
    left_joins = i > 0 and len(gu) > c and groups[row[i - 1]][:c + 1] == gu[:c + 1]
    right_joins = i + 2 < len(row) and len(gv) > c and groups[row[i + 2]][:c + 1] == gv[:c + 1]
    return not left_joins and not right_joins


def _pair_crossings(u: int, v: int, g: ProperGraph, pos: list[float]) -> int:
    """Crossings between the edges of u and of v when u is left of v."""
    n = 0
    for side in (g.above, g.below):
        for a in side[u]:
            pa = pos[a]
            for b in side[v]:
                if pa > pos[b]:
                    n += 1
    return n


def _dfs_rank(g: ProperGraph) -> list[int]:
    """Depth-first preorder from the roots, children in slot order: the starting order for the
    sweeps. Unlike node ids it puts each long edge's lane where its slot is (a residual `h + f(h)`
    has the skip lane left of the branch), which the sweeps alone do not move."""
    n = len(g.layer)
    rank = [-1] * n
    k = 0
    for start in range(n):
        if rank[start] != -1 or g.above[start]:
            continue
        stack = [start]
        while stack:
            v = stack.pop()
            if rank[v] != -1:
                continue
            rank[v] = k
            k += 1
            stack.extend(w for w in reversed(g.below[v]) if rank[w] == -1)
    for v in range(n):  # vertices only reachable through a cycle that folding made
        if rank[v] == -1:
            rank[v] = k
            k += 1
    return rank


def _group_sort(row: list[int], bary: dict[int, float], groups: list[Group]) -> list[int]:
    """Sort a layer by barycenter, keeping the elements of one module contiguous, at every depth.

    Modules are ordered by their members' mean barycenter, then elements inside each; ties keep
    the current order. Done as one sort on a key per element: at each depth, the (mean barycenter,
    first position) of the module it is in there, or its own when it is in no module that deep.
    """
    if len(row) < 2:
        return list(row)
    first = groups[row[0]]
    if all(groups[v] == first for v in row):  # one module (or none): a plain sort
        return sorted(row, key=bary.__getitem__)
    total: dict[str, float] = {}
    count: dict[str, int] = {}
    rank: dict[str, int] = {}
    for i, v in enumerate(row):
        b = bary[v]
        for p in groups[v]:
            if p not in rank:
                rank[p] = i
                total[p] = 0.0
                count[p] = 0
            total[p] += b
            count[p] += 1
    keys: dict[int, list[tuple[float, int]]] = {}
    for i, v in enumerate(row):
        keys[v] = [(total[p] / count[p], rank[p]) for p in groups[v]] + [(bary[v], i)]
    return sorted(row, key=keys.__getitem__)
