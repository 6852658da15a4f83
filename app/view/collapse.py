"""Module collapsing: draw a whole module (and everything inside it) as one node.

A big graph does not fit a browser (STACK.md §3.2: 2,000 elements already paint in ~12 s), so the
graph opens with modules collapsed and the user expands the one they care about. A collapsed
prefix `P` stands for every node whose module is `P` or nested in it; edges between two drawn
elements are merged, and edges inside one collapsed module disappear.

Element ids: `n12` for node 12, `m:blocks.3` for a collapsed module. Expanded modules that hold
drawn elements become boxes (cytoscape compound parents), `g:blocks.3`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from app.view._wire import Wire, inside, node_module, parent_prefix, prefixes

MODULE_PREFIX = "m:"
BOX_PREFIX = "g:"


@dataclass
class VisibleGraph:
    """What is drawn for one choice of collapsed modules (before positions are computed)."""

    elements: list[str]  # drawn node elements, in order of their first member node
    rep: list[str]  # node id -> the element that draws it
    members: dict[str, list[int]]  # module element -> the node ids it stands for
    parent: dict[str, str | None]  # element -> the innermost expanded module (box) around it
    boxes: dict[str, str | None]  # box module -> the box around it
    edges: dict[tuple[str, str], list[tuple[int, int, int]]] = field(default_factory=dict)  # merged

    def count(self) -> int:
        """Cytoscape elements this draws: nodes, boxes and (merged) edges."""
        return len(self.elements) + len(self.boxes) + len(self.edges)


def node_element(node_id: int) -> str:
    return f"n{node_id}"


def module_element(prefix: str) -> str:
    return MODULE_PREFIX + prefix


def box_element(prefix: str) -> str:
    return BOX_PREFIX + prefix


def normalise(wire: Wire, collapsed: Iterable[str]) -> set[str]:
    """Drop prefixes that hold no node and prefixes nested inside another collapsed one."""
    present: set[str] = set()
    for n in wire["nodes"]:
        present.update(prefixes(node_module(n)))
    wanted = {p for p in collapsed if p in present}
    return {p for p in wanted if not any(q in wanted for q in prefixes(parent_prefix(p)))}


def collapse_graph(wire: Wire, collapsed: Iterable[str], *, normalised: bool = False) -> VisibleGraph:
    """The drawn graph when the modules in `collapsed` are folded: O(nodes × depth + edges).
    `normalised=True` skips `normalise` when the caller already did it."""
    folded = set(collapsed) if normalised else normalise(wire, collapsed)
    elements: list[str] = []
    rep: list[str] = []
    members: dict[str, list[int]] = {}
    parent: dict[str, str | None] = {}
    boxes: dict[str, str | None] = {}
    for n in wire["nodes"]:
        path = prefixes(node_module(n))
        fold = next((p for p in path if p in folded), None)
        if fold is None:
            eid, box = node_element(n["id"]), (path[-1] if path else None)
        else:
            eid, box = module_element(fold), parent_prefix(fold)
            members.setdefault(eid, []).append(n["id"])
        rep.append(eid)
        if eid not in parent:
            elements.append(eid)
            parent[eid] = box
            for p in prefixes(box):
                boxes.setdefault(p, parent_prefix(p))
    edges: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    for src, dst, slot in wire["edges"]:
        a, b = rep[src], rep[dst]
        if a != b:
            edges.setdefault((a, b), []).append((src, dst, slot))
    return VisibleGraph(elements, rep, members, parent, boxes, edges)


def visible_count(wire: Wire, collapsed: Iterable[str]) -> int:
    """How many cytoscape elements (nodes + boxes + edges) the graph has with `collapsed` folded."""
    return collapse_graph(wire, collapsed).count()


def _module_sizes(wire: Wire) -> tuple[dict[str, int], dict[str | None, list[str]]]:
    """Nodes inside each module prefix, and the module tree (None is the top level)."""
    size: dict[str, int] = {}
    children: dict[str | None, list[str]] = {}
    for n in wire["nodes"]:
        for p in prefixes(node_module(n)):
            if p not in size:
                size[p] = 0
                children.setdefault(parent_prefix(p), []).append(p)
            size[p] += 1
    return size, children


def default_collapse(wire: Wire, max_visible: int = 300, min_nodes: int = 10) -> set[str]:
    """The modules to fold when a step is first shown, so it draws at most `max_visible` elements.

    A graph that fits is shown whole. Otherwise fold the coarsest modules that were *called*
    (containers such as `nn.ModuleList` never run, so `blocks` is skipped and `blocks.0`,
    `blocks.1`, … are folded: one node per layer). When that leaves fewer than `min_nodes` drawn
    nodes (a model wrapped in one `nn.Sequential`), unfold one level at a time while it still fits.
    If even the coarsest called modules do not fit, fold the top-level containers too.
    """
    if visible_count(wire, ()) <= max_visible:
        return set()
    size, children = _module_sizes(wire)
    modules = wire.get("modules") or {}
    called = {name for name, m in modules.items() if m.get("calls")}

    def cut(roots: list[str]) -> set[str]:
        out: set[str] = set()
        stack = list(reversed(roots))
        while stack:
            p = stack.pop()
            kids = children.get(p, [])
            if (p in called or not kids) and size[p] >= 2:
                out.add(p)
            else:
                stack.extend(reversed(kids))
        return out

    current = cut(children.get(None, []))
    graph = collapse_graph(wire, current)
    while len(graph.elements) < min_nodes:
        finer: set[str] = set()
        for p in current:
            finer |= cut(children.get(p, []))
        if finer == current:
            break
        finer_graph = collapse_graph(wire, finer)
        if finer_graph.count() > max_visible:
            break
        current, graph = finer, finer_graph
    if graph.count() > max_visible:
        top = {p for p in children.get(None, []) if size[p] >= 2}
        if visible_count(wire, top) < graph.count():
            current = top
    return current


def expand_module(collapsed: Iterable[str], prefix: str) -> set[str]:
    """Unfold `prefix`: everything inside it is drawn node by node."""
    return {p for p in collapsed if not inside(p, prefix)}


def collapse_module(collapsed: Iterable[str], prefix: str) -> set[str]:
    """Fold `prefix` (and forget folds nested inside it: they are hidden by this one)."""
    return {p for p in collapsed if not inside(p, prefix)} | {prefix}


def reveal(wire: Wire, collapsed: Iterable[str], node_id: int) -> set[str]:
    """Unfold whatever hides node `node_id` (a search hit or a deep link inside a folded module)."""
    module = node_module(wire["nodes"][node_id])
    return {p for p in collapsed if not inside(module, p)}
