"""Which layer each drawn element goes in, and the y of each layer (steps 1 and 4 of
`app.view.layout`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import networkx as nx

from gradscape.app.view.boxes import BORDER, BOX_PAD, LABEL_H
from gradscape.app.view.layered import Group, common
from gradscape.app.view.step_fields import prefixes

__all__ = ["band_layers", "layer_y"]


def band_layers(groups: list[Group], boxes: dict[str, str | None], pairs: Sequence[tuple[int, int]]) -> list[int]:
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
    children, item_edges, inner_pairs = _items(groups, boxes, pairs)
    start: dict[Any, int] = {}  # item -> first layer, relative to the top of its container
    height: dict[Any, int] = {v: 1 for v in range(n)}
    members: dict[str | None, list[int]] = {}
    for box in sorted(children, key=lambda b: -1 if b is None else len(prefixes(b)), reverse=True):
        items = children[box]
        members[box] = [v for i in items for v in ([i] if isinstance(i, int) else members[i])]
        if _longest_path_starts(items, item_edges[box], start, height):
            height[box] = max((start[i] + height[i] for i in items), default=1)
        else:
            height[box] = _cyclic_box(box, items, item_edges[box], inner_pairs[box], groups, members, start, height)
    return [start[v] + sum(start[p] for p in groups[v]) for v in range(n)]



Items = dict[str | None, list[Any]]


def _items(groups: list[Group], boxes: dict[str, str | None], pairs: Sequence[tuple[int, int]]
           ) -> tuple[Items, dict[str | None, set[tuple[Any, Any]]], dict[str | None, list[tuple[int, int]]]]:
    """Per box (None: the top level): its items (the elements drawn directly in it and the boxes nested in
    it), the edges between its items, and the element pairs that run inside it."""
    children: Items = {None: []}
    for b in boxes:
        children.setdefault(b, [])
    for b, parent in boxes.items():
        children[parent].append(b)
    for v in range(len(groups)):
        children[groups[v][-1] if groups[v] else None].append(v)
    item_edges: dict[str | None, set[tuple[Any, Any]]] = {c: set() for c in children}
    inner_pairs: dict[str | None, list[tuple[int, int]]] = {c: [] for c in children}
    for u, w in pairs:
        ga, gb = groups[u], groups[w]
        c = len(common(ga, gb))
        container = ga[c - 1] if c else None
        iu: Any = ga[c] if len(ga) > c else u
        iw: Any = gb[c] if len(gb) > c else w
        item_edges[container].add((iu, iw))
        for p in (None, *ga[:c]):
            inner_pairs[p].append((u, w))
    return children, item_edges, inner_pairs


def _cyclic_box(box: str | None, items: list[Any], edges: set[tuple[Any, Any]], inner: list[tuple[int, int]],
                groups: list[Group], members: dict[str | None, list[int]], start: dict[Any, int],
                height: dict[Any, int]) -> int:
    """A box whose items form a cycle: each strongly connected set of items is one flat band (element by
    element, as `_layers` does), the rest stays banded. Fills `start`; returns the box's height."""
    dag = nx.DiGraph()
    dag.add_nodes_from(items)
    dag.add_edges_from(edges)
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
        flat = _layers(len(elems), [(local[a], local[b]) for a, b in inner if a in local and b in local])
        cond.nodes[c]["height"] = max(flat, default=0) + 1
        for v in elems:
            start[v] = top + flat[local[v]]
            for p in groups[v]:
                if box is None or len(p) > len(box):
                    start[p] = 0
    return max((band_start[c] + _scc_height(cond, c, height) for c in cond), default=1)

def layer_y(layer: list[int], groups: list[Group], n_layers: int, dy: float) -> list[float]:
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
