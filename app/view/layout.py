"""Node positions for the graph view, computed in Python (cytoscape's `preset` layout).

dagre in the browser is O(n²) and blocks the page for tens of seconds at 2,000 nodes, so positions
are computed on the server, on the (possibly collapsed) graph, in a few steps:

1. Layers, in bands: every edge points down (the loss at the top), and every expanded module takes
   a band of layers of its own: a module that runs after a sibling starts below the sibling's last
   layer (`_band_layers`), so the boxes of `fc3`, `fc2`, `fc1` are stacked and a node never appears
   to sit inside the wrong layer. Inside a band, the plain longest-path layering. Folding a module
   can close a cycle (a module called twice with ops in between); the items of that cycle are laid
   out as one flat band and the edges that close it point up (`"up": true`).
2. Order within layers: barycenter sweeps (down, up, …) that keep the order with the fewest edge
   crossings. Elements of one module stay side by side in every layer (sorted by module first, then
   by barycenter). Long edges (a residual connection skips a whole attention or MLP branch) get a
   dummy vertex in every layer they pass, so they are ordered too and get a lane beside the branch;
   the lane's corners come back as the edge's `bends`.
3. x: Brandes–Köpf (`app.view._bk`): chains and lanes become straight vertical runs, packed with a
   minimum gap from the nodes' widths (each node is as wide as its label), wider between modules.
   Sibling boxes that still intersect (a module called twice around a sibling, or a nested box's
   label wider than the box) are then moved apart (`_separate_boxes`); the box geometry is the one
   cytoscape draws for compound nodes (`box_bounds`).
4. y: layers `dy` apart plus room for the padding and label of each box opening or closing there.

Everything is deterministic (no randomness; ties are broken by node id order) and near-linear.

NOTE [networkx and what is hand-written here]: the step's graph model is `app.view.graph` (a
`networkx.DiGraph`); this module uses networkx where it does the job: `condensation` for the cycles
folding makes. Hand-written, because measured better (this 2-core box, CPU time, best of 5):
- the flat longest-path layering `_layers`: 39 ms on a 10,151-node step against 72 ms for
  `nx.topological_generations`, which also refuses the cycles folding makes;
- the per-band longest path `_longest_path_starts`: ~3,000 small bands in a 10k-node step, where
  building a DiGraph per band costs more than the walk;
- the folded graph (`collapse.collapse_graph`): 145 ms against 194 ms for `graph.step_graph` +
  `graph.by_module` on the 10k step, and its index lists are what the ordering loops need;
- x coordinates (`_bk`): `nx.multipartite_layout` centres each layer in insertion order, so
  chains zig-zag and crossings stay as ordered; Brandes–Köpf keeps chains straight.
Full-layout cost after banding: 37 ms for the expanded 533-node W4 step (21 ms before), 0.8 s for
the expanded 10,151-node step (0.4 s before; more layers, hence more lane vertices for
Brandes–Köpf); the folded views the page opens with take 7 ms and 0.13 s.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import networkx as nx
import numpy as np

from gradscape.app.view._bk import bk_coordinates
from gradscape.app.view._gcpause import gc_paused
from gradscape.app.view._wire import Wire, prefixes
from gradscape.app.view.collapse import box_label, collapse_graph, default_collapse, element_size, normalise

__all__ = ["box_bounds", "box_overlaps", "count_crossings", "default_collapse", "layout_graph"]

Group = tuple[str, ...]
SPACING = 16.0  # the least free space between two drawn nodes of a layer


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
    with gc_paused():
        return _layout(wire, collapsed, sweeps, dx, dy, module_gap, max_visible)


def _layout(wire: Wire, collapsed: Iterable[str] | None, sweeps: int, dx: float, dy: float, module_gap: float,
            max_visible: int) -> dict[str, Any]:
    folded = default_collapse(wire, max_visible) if collapsed is None else normalise(wire, collapsed)
    vg = collapse_graph(wire, folded, normalised=True)
    index = {e: i for i, e in enumerate(vg.elements)}
    pairs = [(index[a], index[b]) for a, b in vg.edges]
    groups: list[Group] = [prefixes(vg.parent[e]) for e in vg.elements]
    layer = _band_layers(groups, vg.boxes, pairs)
    proper = _Proper(layer, groups, pairs)
    rows: list[list[int]] = [[] for _ in range(max(layer, default=-1) + 1)]
    for v in range(len(proper.layer)):
        rows[proper.layer[v]].append(v)
    rows = _order(rows, proper, sweeps)
    sizes = [element_size(wire, e, vg.members.get(e)) for e in vg.elements]
    x = _place_x(rows, proper, [w for w, _ in sizes], dx, dx * module_gap)
    ys = _layer_y(layer, groups, len(rows), dy)
    labels = {b: box_label(wire, b) for b in vg.boxes}
    _separate_boxes(rows, proper, x, [ys[k] for k in layer], sizes, labels)
    lo = min(x, default=0.0)
    nodes: dict[str, dict[str, Any]] = {}
    for v, eid in enumerate(vg.elements):
        entry: dict[str, Any] = {"x": round(x[v] - lo, 2), "y": ys[layer[v]], "layer": layer[v],
                                 "parent": vg.parent[eid], "w": round(sizes[v][0], 1), "h": sizes[v][1]}
        if eid in vg.members:
            entry["members"] = vg.members[eid]
        nodes[eid] = entry
    edges = []
    for k, ((a, b), slots) in enumerate(vg.edges.items()):
        route = proper.routes[k]
        bends = [[round(x[d] - lo, 2), ys[proper.layer[d]]] for d in _corners(route, x)]
        if route[0] != index[a]:  # an edge that points up runs its route backwards
            bends.reverse()
        edges.append({"id": f"e:{a}>{b}", "source": a, "target": b, "slots": [list(s) for s in slots],
                      "up": layer[index[a]] >= layer[index[b]], "bends": bends})
    hidden = {str(i): e for e, ids in vg.members.items() for i in ids}
    return {"collapsed": sorted(folded), "nodes": nodes, "boxes": dict(vg.boxes), "box_labels": labels, "edges": edges,
            "hidden": hidden, "layers": len(rows), "crossings": count_crossings(proper.layer, x, proper.pairs),
            "width": max(x, default=0.0) - lo, "height": ys[-1] if rows else 0.0}


BOX_PAD = 10.0  # a box's padding around what it holds (the stylesheet's `padding` of `node.module`)
BORDER = 3.0  # the widest border a node is drawn with (a root, a folded module, a NaN)
LABEL_H = 16.0  # a box's label: one line of 12 px, above the box, overlapping its top edge by 3.5 px
LABEL_RISE = 12.5
BOX_CHAR = 0.5  # average glyph advance of a box label, as a fraction of its 12 px


def _box_rects(xs: Sequence[float], ys: Sequence[float], sizes: Sequence[tuple[float, float]],
               groups: Sequence[Group], labels: dict[str, str]) -> dict[str, list[float]]:
    """Each box's body `[x1, y1, x2, y2]` as cytoscape sizes a compound node: what it holds (nodes
    with their borders, nested boxes with their labels, which sit above them), grown by the padding."""
    inner: dict[str, list[float]] = {}

    def grow(box: str, r: Sequence[float]) -> None:
        cur = inner.setdefault(box, [math.inf, math.inf, -math.inf, -math.inf])
        cur[0], cur[1] = min(cur[0], r[0]), min(cur[1], r[1])
        cur[2], cur[3] = max(cur[2], r[2]), max(cur[3], r[3])

    for v, g in enumerate(groups):
        if g:
            w, h = sizes[v]
            grow(g[-1], (xs[v] - w / 2 - BORDER, ys[v] - h / 2 - BORDER, xs[v] + w / 2 + BORDER,
                         ys[v] + h / 2 + BORDER))
    out: dict[str, list[float]] = {}
    for box in sorted(inner.keys() | {p for g in groups for p in g}, key=lambda b: -len(prefixes(b))):
        if box not in inner:
            continue
        r = inner[box]
        body = [r[0] - BOX_PAD - 1.5, r[1] - BOX_PAD - 1.5, r[2] + BOX_PAD + 1.5, r[3] + BOX_PAD + 1.5]
        out[box] = body
        parent = box.rsplit(".", 1)[0] if "." in box else None
        if parent is not None:
            half = len(labels.get(box, box)) * 12 * BOX_CHAR / 2
            mid = (body[0] + body[2]) / 2
            grow(parent, (min(body[0], mid - half), body[1] - LABEL_RISE, max(body[2], mid + half), body[3]))
    return out


def box_bounds(layout: dict[str, Any]) -> dict[str, tuple[float, float, float, float]]:
    """The rectangle `(x1, y1, x2, y2)` each module box of a layout covers as drawn (its body: what it
    holds, nested boxes' labels included, plus padding; its own label is above it)."""
    names = list(layout["nodes"])
    infos = [layout["nodes"][e] for e in names]
    groups = [prefixes(i["parent"]) for i in infos]
    rects = _box_rects([i["x"] for i in infos], [i["y"] for i in infos], [(i["w"], i["h"]) for i in infos],
                       groups, layout.get("box_labels") or {})
    return {b: (r[0], r[1], r[2], r[3]) for b, r in rects.items()}


def box_overlaps(layout: dict[str, Any]) -> list[tuple[str, str]]:
    """Pairs of sibling boxes (same parent box, or both at the top level) whose rectangles intersect."""
    bounds = box_bounds(layout)
    siblings: dict[str | None, list[str]] = {}
    for b, parent in layout["boxes"].items():
        if b in bounds:
            siblings.setdefault(parent, []).append(b)
    out = []
    for group in siblings.values():
        group.sort(key=lambda b: bounds[b][0])
        for i, a in enumerate(group):
            ax1, ay1, ax2, ay2 = bounds[a]
            for b in group[i + 1:]:
                bx1, by1, bx2, by2 = bounds[b]
                if bx1 >= ax2:
                    break
                if ay1 < by2 and by1 < ay2:
                    out.append((a, b))
    return out


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
def _band_layers(groups: list[Group], boxes: dict[str, str | None], pairs: Sequence[tuple[int, int]]) -> list[int]:
    """Layers in which every expanded module occupies a band of its own: a module that runs after a
    sibling (any edge from one to the other) starts below the sibling's last layer, so the boxes of
    `fc3` and `fc2` (or `blocks.0` and `blocks.1`) are stacked, never interleaved.

    Bottom-up over the module tree: inside each box, its items (elements drawn directly in it and the
    boxes nested in it, each as tall as its own band) form a DAG; an item starts at the longest path
    to it, counted in the heights of the items before it (the plain longest-path layering when every
    item is one element). A box whose items form a cycle (only possible once folding merged ops of a
    module called twice) is laid out flat, element by element, as `_layers` does.
    """
    n = len(groups)
    children: dict[str | None, list[Any]] = {None: []}
    for b in boxes:
        children.setdefault(b, [])
    for b, parent in boxes.items():
        children[parent].append(b)
    for v in range(n):
        children[groups[v][-1] if groups[v] else None].append(v)
    item_edges: dict[str | None, set[tuple[Any, Any]]] = {c: set() for c in children}
    inner_pairs: dict[str | None, list[tuple[int, int]]] = {c: [] for c in children}
    for u, w in pairs:
        ga, gb = groups[u], groups[w]
        c = len(_common(ga, gb))
        container = ga[c - 1] if c else None
        iu: Any = ga[c] if len(ga) > c else u
        iw: Any = gb[c] if len(gb) > c else w
        item_edges[container].add((iu, iw))
        for p in (None, *ga[:c]):
            inner_pairs[p].append((u, w))
    start: dict[Any, int] = {}  # item -> first layer, relative to the top of its container
    height: dict[Any, int] = {v: 1 for v in range(n)}
    members: dict[str | None, list[int]] = {}
    for box in sorted(children, key=lambda b: -1 if b is None else len(prefixes(b)), reverse=True):
        items = children[box]
        inside = [v for i in items for v in ([i] if isinstance(i, int) else members[i])]
        members[box] = inside
        if _longest_path_starts(items, item_edges[box], start, height):
            height[box] = max((start[i] + height[i] for i in items), default=1)
            continue
        # a cycle: each strongly connected set of items is one flat band, the rest stays banded
        dag = nx.DiGraph()
        dag.add_nodes_from(items)
        dag.add_edges_from(item_edges[box])
        cond = nx.condensation(dag)
        band_start: dict[int, int] = {}
        for c in nx.topological_sort(cond):
            scc = cond.nodes[c]["members"]
            top = max((band_start[u] + _scc_height(cond, u, height) for u in cond.predecessors(c)), default=0)
            band_start[c] = top
            if len(scc) == 1:
                (i,) = scc
                start[i] = top
                continue
            elems = [v for i in scc for v in ([i] if isinstance(i, int) else members[i])]
            local = {v: k for k, v in enumerate(elems)}
            flat = _layers(len(elems), [(local[a], local[b]) for a, b in inner_pairs[box] if a in local and b in local])
            cond.nodes[c]["height"] = max(flat, default=0) + 1
            for v in elems:
                start[v] = top + flat[local[v]]
                for p in groups[v]:
                    if box is None or len(p) > len(box):
                        start[p] = 0
        height[box] = max((band_start[c] + _scc_height(cond, c, height) for c in cond), default=1)
    return [start[v] + sum(start[p] for p in groups[v]) for v in range(n)]


def _separate_boxes(rows: list[list[int]], g: _Proper, x: list[float], ys: list[float],
                    sizes: list[tuple[float, float]], labels: dict[str, str], rounds: int = 60) -> None:
    """Move sibling boxes that still intersect apart, in place. Banded layers leave only boxes that
    share layers: a module called twice with a sibling between its calls (a pooling layer used after
    two convolutions), two branches side by side, or a nested box label wider than its box. The box
    further right (or the one inside the other's layers) moves right with everything right of it in
    its own layers, so order and gaps within every layer are kept."""
    n = len(sizes)
    groups = g.groups[:n]
    for _ in range(rounds):
        boxed = _box_rects(x[:n], ys, sizes, groups, labels)
        rect = {b: [r[0], r[2], r[1], r[3]] for b, r in boxed.items()}  # x1, x2, y1, y2
        clash = None
        family: dict[str | None, list[str]] = {}
        for b in rect:
            family.setdefault(_parent_of(b), []).append(b)
        for group in family.values():
            group.sort(key=lambda b: rect[b][0])
            for i, a in enumerate(group):
                ra = rect[a]
                for b in group[i + 1:]:
                    rb = rect[b]
                    if rb[0] >= ra[1]:
                        break
                    if ra[2] < rb[3] and rb[2] < ra[3]:
                        clash = (a, b)
                        break
                if clash:
                    break
            if clash:
                break
        if clash is None:
            return
        a, b = clash
        ra, rb = rect[a], rect[b]
        inner_b = ra[2] < rb[2] and rb[3] < ra[3]
        inner_a = rb[2] < ra[2] and ra[3] < rb[3]
        left, right = (a, b) if inner_b or (not inner_a and ra[0] + ra[1] <= rb[0] + rb[1]) else (b, a)
        shift = rect[left][1] - rect[right][0] + SPACING
        depth = len(prefixes(right))
        for row in rows:
            hit = next((i for i, v in enumerate(row) if len(g.groups[v]) >= depth and g.groups[v][depth - 1] == right),
                       None)
            if hit is not None:
                for v in row[hit:]:
                    x[v] += shift


def _parent_of(box: str) -> str | None:
    return box.rsplit(".", 1)[0] if "." in box else None


def _layer_y(layer: list[int], groups: list[Group], n_layers: int, dy: float) -> list[float]:
    """y of each layer: `dy` apart, plus room for the padding of every box that closes above the
    gap or opens below it, so stacked boxes (each padded per nesting level) never touch."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for v, k in enumerate(layer):
        for p in groups[v]:
            first[p] = min(first.get(p, k), k)
            last[p] = max(last.get(p, k), k)
    opening = [0] * (n_layers + 1)
    closing = [0] * (n_layers + 1)
    for v, k in enumerate(layer):
        opening[k] = max(opening[k], sum(1 for p in groups[v] if first[p] == k))
        closing[k] = max(closing[k], sum(1 for p in groups[v] if last[p] == k))
    ys = [0.0] * max(n_layers, 1)
    for k in range(1, n_layers):
        ys[k] = ys[k - 1] + dy + (BOX_PAD + BORDER) * closing[k - 1] + (BOX_PAD + BORDER + LABEL_H) * opening[k]
    return ys


def _longest_path_starts(items: list[Any], edges: set[tuple[Any, Any]], start: dict[Any, int],
                         height: dict[Any, int]) -> bool:
    """Each item's start: the longest path to it, counted in the heights of the items before it
    (Kahn's algorithm). False, with nothing set, when the items form a cycle."""
    pred: dict[Any, list[Any]] = {i: [] for i in items}
    succ: dict[Any, list[Any]] = {i: [] for i in items}
    for a, b in edges:
        pred[b].append(a)
        succ[a].append(b)
    indeg = {i: len(pred[i]) for i in items}
    order = [i for i in items if indeg[i] == 0]
    for i in order:  # the list grows while it is read
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                order.append(j)
    if len(order) < len(items):
        return False
    for i in order:
        start[i] = max((start[u] + height[u] for u in pred[i]), default=0)
    return True


def _scc_height(cond: nx.DiGraph, c: int, height: dict[Any, int]) -> int:
    if "height" in cond.nodes[c]:
        return int(cond.nodes[c]["height"])
    (i,) = cond.nodes[c]["members"]
    return height[i]


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


def _sweep(rows: list[list[int]], g: _Proper, sweeps: int) -> tuple[list[list[int]], int]:
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


def _transpose(rows: list[list[int]], g: _Proper, pos: list[float], rounds: int = 4) -> bool:
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
    c = len(_common(gu, gv))
    left_joins = i > 0 and len(gu) > c and groups[row[i - 1]][:c + 1] == gu[:c + 1]
    right_joins = i + 2 < len(row) and len(gv) > c and groups[row[i + 2]][:c + 1] == gv[:c + 1]
    return not left_joins and not right_joins


def _pair_crossings(u: int, v: int, g: _Proper, pos: list[float]) -> int:
    """Crossings between the edges of u and of v when u is left of v."""
    n = 0
    for side in (g.above, g.below):
        for a in side[u]:
            pa = pos[a]
            for b in side[v]:
                if pa > pos[b]:
                    n += 1
    return n


def _dfs_rank(g: _Proper) -> list[int]:
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


# ---------------------------------------------------------------------------- x
def _place_x(rows: list[list[int]], g: _Proper, widths: list[float], dx: float, extra: float) -> list[float]:
    """Brandes–Köpf coordinates (see `app.view._bk`): neighbours in a layer at least `dx` apart and
    never closer than their widths allow (plus `SPACING`)."""
    n_real = len(widths)
    dummy = [v >= n_real for v in range(len(g.layer))]
    half = [w / 2 for w in widths] + [0.0] * (len(g.layer) - n_real)

    def gap(a: int, b: int) -> float:
        # lanes of long edges pack tighter than nodes; modules keep a margin so boxes do not touch
        base = dx / 2 if dummy[a] or dummy[b] else dx
        base = max(base, half[a] + half[b] + SPACING)
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
