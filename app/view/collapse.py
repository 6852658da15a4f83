"""Module collapsing: draw a whole module (and everything inside it) as one node.

A big graph does not fit a browser (2,000 cytoscape elements already take seconds to paint), so the
graph opens with modules collapsed and the user expands the one they care about. A collapsed
prefix `P` stands for every node whose module is `P` or nested in it; edges between two drawn
elements are merged, and edges inside one collapsed module disappear.

Element ids (made and read by `app.view.ids` only): `n12` for node 12, `m:blocks.3` for a collapsed
module. Expanded modules that hold drawn elements become boxes (cytoscape compound parents), `g:blocks.3`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradscape.app.view.call_folds import CALLS_SHOWN, CallView
from gradscape.app.view.calls import call_label, call_members, call_title, more_label
from gradscape.app.view.ids import (
    box_element,
    call_element,
    module_element,
    module_of,
    more_element,
    node_element,
    node_of,
    run_of,
)
from gradscape.app.view.op_runs import RUNS_FROM, Run, Runs, cut_runs, drawn_ops
from gradscape.app.view.step_fields import (
    StepIndex,
    Wire,
    inside,
    module_type,
    node_label,
    node_module,
    parent_prefix,
    prefixes,
    step_index,
)


@dataclass
class VisibleGraph:
    """What is drawn for one choice of collapsed modules (before positions are computed)."""

    elements: list[str]  # drawn node elements, in order of their first member node
    rep: list[str]  # node id -> the element that draws it
    members: dict[str, list[int]]  # module element -> the node ids it stands for
    parent: dict[str, str | None]  # element -> the innermost expanded module (box) around it
    boxes: dict[str, str | None]  # box module -> the box around it
    edges: dict[tuple[str, str], list[tuple[int, int, int]]] = field(default_factory=dict)  # merged
    labels: dict[str, str] = field(default_factory=dict)  # folded call -> its label (app/view/call_folds.py)

    def count(self) -> int:
        """Cytoscape elements this draws: nodes, boxes and (merged) edges."""
        return len(self.elements) + len(self.boxes) + len(self.edges)


# Sizes of what is drawn (model units; the stylesheet reads them from `data.w`/`data.h`), so the
# layout leaves room for every label: a label is one line of `FONT` px (a folded module two lines,
# name and class/count), and `CHAR` is the widest average glyph advance of the sans-serif fonts the
# page falls back to, as a fraction of the font size.
FONT = 12
MODULE_FONT = 13
CHAR = 0.64
NODE_H = 30.0
MODULE_H = 48.0
MIN_W, MAX_W = 70.0, 240.0


def text_width(text: str, font: float = FONT) -> float:
    """Width of a box holding `text` on one line (capped: longer labels are cut with an ellipsis and
    shown whole on hover)."""
    return min(max(len(text) * font * CHAR + 18.0, MIN_W), MAX_W)


def module_label(wire: Wire, prefix: str, count: int) -> str:
    """A folded module's two-line label: its name, then its class and how many nodes it holds."""
    kind = module_type(wire, prefix)
    return f"{prefix}\n" + (f"{kind} · " if kind else "") + f"{count} nodes"


def box_label(wire: Wire, prefix: str) -> str:
    """An expanded module's box label: `encoder.layers.0 (TransformerEncoderLayer)`; an opened call's,
    `cell · call 17 of 300`."""
    module, mark, call = prefix.partition("#")
    if mark:
        return call_title(wire, module, int(call))
    kind = module_type(wire, prefix)
    return prefix + (f" ({kind})" if kind else "")


def element_size(wire: Wire, eid: str, members: list[int] | None = None,
                 label: str | None = None) -> tuple[float, float]:
    """(width, height) of a drawn node element (`n12`, `m:blocks.3`, or a folded call with its `label`)."""
    if (module := module_of(eid)) is not None or label is not None:
        text = label if label is not None else module_label(wire, module or "", len(members or []))
        return max(text_width(line, MODULE_FONT) for line in text.split("\n")), MODULE_H
    node = node_of(eid)
    if node is None:
        raise ValueError(f"{eid!r} is not a drawn node element")
    return text_width(node_label(wire["nodes"][node], wire)), NODE_H


def normalise(wire: Wire, collapsed: Iterable[str]) -> set[str]:
    """Drop prefixes that hold no node and prefixes nested inside another collapsed one."""
    present: set[str] = set()
    for module in step_index(wire).modules:
        present.update(prefixes(module))
    wanted = {p for p in collapsed if p in present}
    return {p for p in wanted if not any(q in wanted for q in prefixes(parent_prefix(p)))}


def collapse_graph(wire: Wire, collapsed: Iterable[str], *, normalised: bool = False,
                   views: dict[str, CallView] | None = None, runs: Runs | None = None,
                   every_run: bool = False) -> VisibleGraph:
    """The drawn graph when the modules in `collapsed` are folded and those in `views` are opened into their
    calls (`app.view.call_folds`, checked by `valid_views`), a box's ops in runs past `op_runs.RUNS_FROM`
    (`runs`: those opened and drawn; `every_run`: all drawn): O(nodes × depth + edges). `normalised=True`
    skips `normalise` when the caller already did it."""
    folded = set(collapsed) if normalised else normalise(wire, collapsed)
    elements: list[str] = []
    rep: list[str] = []
    members: dict[str, list[int]] = {}
    parent: dict[str, str | None] = {}
    boxes: dict[str, str | None] = {}
    index = step_index(wire)
    by_call, call_box, which, in_call = _call_places(wire, index, views or {})
    in_box = {nid: f"{index.module_of(nid)}#{k}" for nid, (k, direct) in in_call.items() if direct}
    in_run, run_box, run_labels = _in_runs(wire, index, folded, by_call, in_call, in_box, runs or Runs(),
                                           every_run)
    by_call, call_box = by_call | in_run, call_box | run_box
    placed: dict[int, tuple[str | None, str | None]] = {}  # module code → (its fold's element, box)
    for nid, code in enumerate(index.module_code):
        if (call := by_call.get(nid)) is not None:
            place: tuple[str | None, str | None] = (call, call_box[call])
        elif (place := placed.get(code)) is None:  # type: ignore[assignment]
            path = prefixes(index.module_of(nid))
            fold = next((p for p in path if p in folded), None)
            place = placed[code] = ((None, path[-1] if path else None) if fold is None
                                    else (module_element(fold), parent_prefix(fold)))
        eid, box = place
        if eid is None:
            eid = node_element(nid)
            box = in_box.get(nid, box)  # an op of a call opened: in the call's box
        else:
            members.setdefault(eid, []).append(nid)
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
    labels = {e: call_label(wire, call_box[e], k, len(members[e])) if k is not None
              else more_label(wire, call_box[e], (views or {})[call_box[e]].shown, CALLS_SHOWN)
              for e, k in which.items() if e in members}
    return VisibleGraph(elements, rep, members, parent, boxes, edges, labels | run_labels)


def _in_runs(wire: Wire, index: StepIndex, folded: set[str], by_call: dict[int, str],
             in_call: dict[int, tuple[int, bool]], in_box: dict[int, str], runs: Runs,
             every: bool) -> tuple[dict[int, str], dict[str, str], dict[str, str]]:
    """The ops drawn one by one in an open module's box, past `RUNS_FROM` of one call, folded into runs
    (`op_runs`): node id → its run's element, the run's box, the runs' labels. Only a module with over
    `RUNS_FROM` nodes of its own is looked at."""
    codes = np.asarray(index.module_code, dtype=np.int64)
    big = np.nonzero(np.bincount(codes + 1) > RUNS_FROM)[0] - 1
    groups: dict[tuple[str, int], list[int]] = {}
    for code in big[big >= 0].tolist():
        path = prefixes(index.modules[code])
        if any(p in folded for p in path):
            continue
        for nid in np.nonzero(codes == code)[0].tolist():
            if nid not in by_call:
                groups.setdefault((in_box.get(nid, path[-1]), in_call.get(nid, (0, False))[0]), []).append(nid)
    where, labels = cut_runs(wire, groups, runs, every)
    return where, {e: (run_of(e) or ("",))[0] for e in labels}, labels


def _call_places(wire: Wire, index: StepIndex, views: dict[str, CallView]) -> tuple[dict[int, str], dict[str, str],
                                                                     dict[str, int | None],
                                                                     dict[int, tuple[int, bool]]]:
    """For the modules opened into their calls: node id → its folded call's element (none for a call opened
    or a node of no single call), that element → the module (its box), which call it is (None: the
    calls not drawn yet); and node id → its call, and whether it is an op of the module itself (drawn in
    the call's box, `cell#17`: `step_fields.prefixes`), for the calls opened into ops."""
    by_call: dict[int, str] = {}
    box: dict[str, str] = {}
    which: dict[str, int | None] = {}
    in_call: dict[int, tuple[int, bool]] = {}
    for module, view in views.items():
        more = more_element(module)
        for k, nodes in enumerate(call_members(wire, module).calls, 1):
            if k in view.opened:  # (which call, an op of the module itself: not of a submodule)
                in_call.update((n, (k, index.module_of(n) == module)) for n in nodes)
                continue
            if not nodes:
                continue
            eid = call_element(module, k) if k <= view.shown else more
            box[eid] = module
            which[eid] = k if k <= view.shown else None
            by_call.update(dict.fromkeys(nodes, eid))
    return by_call, box, which, in_call


def visible_count(wire: Wire, collapsed: Iterable[str]) -> int:
    """How many cytoscape elements (nodes + boxes + edges) the graph has with `collapsed` folded."""
    return collapse_graph(wire, collapsed).count()


class _ModuleTree:
    """The module prefixes that hold nodes: their sizes, children, and which ran a forward."""

    def __init__(self, wire: Wire) -> None:
        self.size: dict[str, int] = {}
        self.children: dict[str | None, list[str]] = {}  # None: the top level
        index = step_index(wire)
        counts = Counter(index.module_code)
        for code, module in enumerate(index.modules):  # in the order of their first nodes, as the prefixes'
            for p in prefixes(module):
                if p not in self.size:
                    self.size[p] = 0
                    self.children.setdefault(parent_prefix(p), []).append(p)
                self.size[p] += counts[code]
        self.called = {name for name, m in wire["modules"].items() if m["calls"]}

    def own(self, p: str) -> int:
        """Nodes of `p` itself, in no submodule."""
        return self.size[p] - sum(self.size[k] for k in self.children.get(p, []))

    def in_runs(self, folded: set[str], opened: Counter[str]) -> int:
        """How many fewer elements the open modules draw for their own ops drawn in runs (`op_runs`) than
        one by one. `folded` is normalised."""
        saved = 0
        stack = [p for p in self.children.get(None, []) if p not in folded]
        while stack:
            p = stack.pop()
            own = self.own(p)
            saved += own - drawn_ops(own, opened[p])
            stack.extend(k for k in self.children.get(p, []) if k not in folded)
        return saved

    def loose(self, folded: set[str], opened: Counter[str] | None = None) -> dict[str, int]:
        """For each open module (neither folded nor inside a fold), how many elements its nodes drawn one by
        one make (its own ops past `RUNS_FROM` as runs, `opened` of them opened). `folded` is normalised."""
        out: dict[str, int] = {}
        opened = opened or Counter()

        def count(p: str) -> int:  # p is open; recursion is as deep as the module nesting
            kids = self.children.get(p, [])
            n = drawn_ops(self.own(p), opened[p])
            n += sum(count(k) for k in kids if k not in folded)
            out[p] = n
            return n
        for p in self.children.get(None, []):
            if p not in folded:
                count(p)
        return out

    def coarsest(self, roots: list[str]) -> set[str]:
        """The outermost called modules at or below `roots`, to fold. Containers that never ran
        (`nn.ModuleList`) are looked into instead; a module of a single node is left drawn."""
        out: set[str] = set()
        stack = list(reversed(roots))
        while stack:
            p = stack.pop()
            kids = self.children.get(p, [])
            if (p in self.called or not kids) and self.size[p] >= 2:
                out.add(p)
            else:
                stack.extend(reversed(kids))
        return out


def default_collapse(wire: Wire, max_visible: int = 300, min_nodes: int = 10) -> set[str]:
    """The modules to fold when a step is first shown, so it draws at most `max_visible` elements.

    A graph that fits is shown whole. Otherwise fold the coarsest modules that were *called*
    (containers such as `nn.ModuleList` never run, so `blocks` is skipped and `blocks.0`,
    `blocks.1`, … are folded: one node per layer). When that leaves fewer than `min_nodes` drawn
    nodes (a model wrapped in one `nn.Sequential`), unfold one level at a time while it still fits.
    If even the coarsest called modules do not fit, fold the top-level containers too.
    """
    return default_folds(wire, max_visible, min_nodes)[0]


def default_folds(wire: Wire, max_visible: int = 300, min_nodes: int = 10) -> tuple[set[str], VisibleGraph | None]:
    """`default_collapse`'s folds (normalised), and the graph they draw when it was built on the way (None
    otherwise): at 100k nodes each `collapse_graph` walks every node, and the layout needs that graph."""
    # every node is an element: past `max_visible` nodes, drawing the whole graph cannot fit
    if len(wire["nodes"]) <= max_visible and visible_count(wire, ()) <= max_visible:
        return set(), None
    tree = _ModuleTree(wire)  # the folds below are its modules, none inside another: normalised
    current = tree.coarsest(tree.children.get(None, []))
    graph = collapse_graph(wire, current, normalised=True)
    while len(graph.elements) < min_nodes:
        finer: set[str] = set()
        for p in current:
            finer |= tree.coarsest(tree.children.get(p, []))
        # each fold is one element and each node outside them another: past `max_visible`, stop here
        # without drawing it (a model of one module folds to nothing finer but all its nodes)
        if finer == current or len(finer) + len(wire["nodes"]) - sum(tree.size[p] for p in finer) > max_visible:
            break
        finer_graph = collapse_graph(wire, finer, normalised=True)
        if finer_graph.count() > max_visible:
            break
        current, graph = finer, finer_graph
    if graph.count() > max_visible:
        top = {p for p in tree.children.get(None, []) if tree.size[p] >= 2}
        top_graph = collapse_graph(wire, top, normalised=True)
        if top_graph.count() < graph.count():
            current, graph = top, top_graph
    return current, graph


MAX_DRAWN = 10_000  # nodes and folded modules the page draws at most (a 10k-node step opened whole fits)


def fit_drawn(wire: Wire, folded: set[str], max_drawn: int = MAX_DRAWN,
              runs: Iterable[Run] = ()) -> tuple[set[str], list[str]]:
    """`folded` (normalised), with open modules folded again until at most `max_drawn` nodes and folds
    are drawn; and the modules folded again. A module called 6,000 times in a loop holds 90,000 nodes:
    opened whole, laying it out took the server down, and no browser draws that many. Each time the open
    module folded is the innermost open one that brings the count under `max_drawn` by itself (so
    opening `encoder.cell` of a loop folds `encoder.cell` again, not `encoder`), else the one with the
    most nodes drawn one by one. A module's own ops past `RUNS_FROM` count as their runs (`runs`: those
    opened), as `collapse_graph` draws them."""
    n_nodes = len(wire["nodes"])
    if n_nodes + len(folded) <= max_drawn:  # fits whatever is open: no module tree to build (every layout)
        return set(folded), []
    tree = _ModuleTree(wire)
    opened = Counter(box for box, _call, _run in runs)  # the runs opened
    folded, refolded = set(folded), []
    while (excess := len(folded) + n_nodes - sum(tree.size[p] for p in folded) - tree.in_runs(folded, opened)
           - max_drawn) > 0:
        loose = tree.loose(folded, opened)
        if not loose:
            break
        enough = [p for p in loose if loose[p] - 1 >= excess]  # folded, p's loose nodes become one
        worst = (max(enough, key=lambda p: (p.count("."), loose[p])) if enough
                 else max(loose, key=lambda p: (loose[p], p.count("."))))
        folded = collapse_module(folded, worst)
        refolded.append(worst)
    return folded, refolded


def expand_one_level(wire: Wire, collapsed: Iterable[str], prefix: str) -> set[str]:
    """Unfold `prefix` but keep its own submodules folded: opening a 200-block `nn.ModuleList`
    shows 200 block nodes, not every op of every block."""
    tree = _ModuleTree(wire)
    return expand_module(collapsed, prefix) | tree.coarsest(tree.children.get(prefix, []))


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


def visible_element(layout: dict[str, Any], ref: str) -> str | None:
    """The drawn element that shows `ref` (`n<id>` or `m:<module>`) in a layout from
    `layout_graph`: the node itself, the folded module hiding it, or an expanded module's box.
    None when nothing of it is drawn."""
    nodes = layout["nodes"]
    if ref in nodes:
        return ref
    if (prefix := module_of(ref)) is not None:
        if prefix in layout["boxes"]:
            return box_element(prefix)
        hiding = next((p for p in layout["collapsed"] if inside(prefix, p)), None)
        return None if hiding is None else module_element(hiding)
    node = node_of(ref)
    if node is None:
        return None
    # the fold that holds it (a walk over the folds' members: a deep link or a search hit, not every click)
    return next((e for e, info in nodes.items() if node in info.get("members", ())), None)
