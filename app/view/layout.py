"""Node positions for the graph view, computed in Python (cytoscape's `preset` layout).

dagre in the browser is O(n²) and blocks the page for tens of seconds at 2,000 nodes, so positions
are computed on the server, on the (possibly collapsed) graph, in a few steps:

1. Layers, in bands: every edge points down (the loss at the top), and every expanded module takes
   a band of layers of its own: a module that runs after a sibling starts below the sibling's last
   layer (`layers.band_layers`), so the boxes of `fc3`, `fc2`, `fc1` are stacked and a node never appears
   to sit inside the wrong layer. Inside a band, the plain longest-path layering. Folding a module
   can close a cycle (a module called twice with ops in between); the items of that cycle are laid
   out as one flat band and the edges that close it point up (`"up": true`).
2. Order within layers: barycenter sweeps (down, up, …) that keep the order with the fewest edge
   crossings. Elements of one module stay side by side in every layer (sorted by module first, then
   by barycenter). Long edges (a residual connection skips a whole attention or MLP branch) get a
   dummy vertex in every layer they pass, so they are ordered too and get a lane beside the branch;
   the lane's corners come back as the edge's `bends` (`ordering`, on the `layered.ProperGraph`).
3. x: Brandes–Köpf (`app.view.x_coordinates`): chains and lanes become straight vertical runs, packed with a
   minimum gap from the nodes' widths (each node is as wide as its label), wider between modules.
   Sibling boxes that still intersect (a module called twice around a sibling, or a nested box's
   label wider than the box) are then moved apart (`boxes.separate_boxes`); the box geometry is the
   one cytoscape draws for compound nodes (`boxes.box_bounds`).
4. y: layers `dy` apart plus room for the padding and label of each box opening or closing there
   (`layers.layer_y`).

Everything is deterministic (no randomness; ties are broken by node id order) and near-linear.

NOTE [networkx and what is hand-written here]: networkx is used where it does the job: `condensation`
for the cycles folding makes (`layers.py`), and the problem finder's own graph of the recorder's nodes in
the training process (tracer/record/debug/step_checks.py). The page keeps no networkx model of the step: one
(`app/view/graph.py`: step_graph, by_module, layers, reachability, paths) was read by tests only, and
routing the layout through it measured slower on bench/ui.py's 10,151-node step (this 2-core box, CPU
time, best of 5): building the DiGraph 61 ms, folding it (`by_module`) 24 ms more, 74 ms together,
against 27 ms for `collapse.collapse_graph`, whose index lists are what the ordering loops need (and a
whole first expand lays out in 33 ms). So it was removed (issue 18). Hand-written, because measured
better:
- the flat longest-path layering `layers._layers`: 39 ms on a 10,151-node step against 72 ms for
  `nx.topological_generations`, which also refuses the cycles folding makes;
- the per-band longest path `layers._longest_path_starts`: ~3,000 small bands in a 10k-node step, where
  building a DiGraph per band costs more than the walk;
- the folded graph (`collapse.collapse_graph`), as above;
- x coordinates (`x_coordinates`): `nx.multipartite_layout` centres each layer in insertion order, so
  chains zig-zag and crossings stay as ordered; Brandes–Köpf keeps chains straight.
Full-layout cost after banding: 37 ms for the expanded 533-node W4 step (21 ms before), 0.8 s for
the expanded 10,151-node step (0.4 s before; more layers, hence more lane vertices for
Brandes–Köpf); the folded views the page opens with take 7 ms and 0.13 s.

NOTE [Why not a layout engine]: bench/layout.py lays the page's views out with this module and with
Graphviz dot, grandalf, and dash-cytoscape's dagre and klay (in Chromium), and counts the same things
for each (this shared 2-core box, best of 3): on the 12-layer GPT (W4), the opening view, each of its
16 folded modules opened for the first time, and every node drawn; on the 10,151-node step, the
opening view and each of its 50 stages opened.
- time, W4 first expand p50/p95 and full: here 2/10 ms and 88 ms; dot 51/72 ms and 178 ms; grandalf
  8/16 ms and 0.48 s; dagre 61/119 ms and 21.6 s; klay 23/68 ms and 1.8 s. 10k first expand: here
  117/160 ms, dot 98/148 ms, grandalf 75/106 ms (most of each is folding the 10k nodes, shared by
  all; dagre's and klay's figures leave it out);
- edge crossings as drawn (W4 expands, full): here 0, 0; dot 0, 0; grandalf 0, 22; dagre 0, 0;
  klay 74, 402;
- sibling boxes overlapping (W4 expands, full): here 0, 0; dot 1, 15 (a cluster's label sits inside
  it, the page draws it above); grandalf 1, 64 (it knows nothing of modules); dagre 0, 0; klay 0, 12;
- what was on screen moving on a W4 first expand (mean, model px, after the page's pan): here 7,
  dot 53, grandalf 13, dagre 24, klay 64; on the 10k step 0 for all but klay (183).
No engine draws fewer crossings or fewer overlaps, moves less, or is faster where it matters, so the
layout stays here; it is split into the steps above, each in its own module.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gradscape.app.view.boxes import box_bounds, box_overlaps, separate_boxes
from gradscape.app.view.call_folds import CallView, fold_tokens, split_folds, valid_views
from gradscape.app.view.collapse import (
    VisibleGraph,
    box_label,
    collapse_graph,
    default_collapse,
    default_folds,
    element_size,
    fit_drawn,
    normalise,
)
from gradscape.app.view.crossings import count_crossings
from gradscape.app.view.layered import SPACING, Group, ProperGraph, corners
from gradscape.app.view.layers import band_layers, layer_y
from gradscape.app.view.op_runs import Runs, run_tokens, split_runs
from gradscape.app.view.ordering import order_layers
from gradscape.app.view.step_fields import Wire, inside, prefixes
from gradscape.app.view.x_coordinates import x_coordinates
from gradscape.tracer.collector import raised_gc_threshold

__all__ = ["box_bounds", "box_overlaps", "count_crossings", "default_collapse", "layout_graph"]


def layout_graph(wire: Wire, collapsed: Iterable[str] | None = None, *, sweeps: int = 6, dx: float = 110.0,
                 dy: float = 48.0, module_gap: float = 0.5, max_visible: int = 300,
                 max_drawn: int | None = None) -> dict[str, Any]:
    """Positions of every drawn element, as JSON-ready data for `elements.cytoscape_elements`.

    `collapsed`: module prefixes to fold, and modules opened into their calls (tokens of
    `app.view.call_folds`); None means `default_collapse(wire, max_visible)` and an empty set draws every
    node. `sweeps=0` keeps the insertion (node id) order: the baseline the
    crossing reduction is measured against.

    Returns `{"collapsed": [...], "nodes": {element: {"x", "y", "layer", "parent", "members"?}},
    "boxes": {module: parent module | None}, "edges": [{"id", "source", "target", "slots", "up",
    "bends"}], "layers", "crossings", "width", "height"}`; a folded module's or call's entry lists the node
    ids it holds (`members`), a folded call's its `label`. `"collapsed"` is the fold list as the page keeps
    it (the views' tokens included).
    An edge's `slots` are the `[src, dst, slot]` wire edges it stands for; `bends` are the points
    `[x, y]` a long edge is routed through (empty for an edge between neighbouring layers).
    `max_drawn`: with it, modules are folded again past that many drawn nodes and folds
    (`collapse.fit_drawn`), and `"refolded"` lists them.
    """
    with raised_gc_threshold():
        views: dict[str, CallView] = {}
        runs = Runs()
        if collapsed is None:
            folded, vg = default_folds(wire, max_visible)
        else:
            asked, views = split_folds(collapsed)
            folded, vg, runs = normalise(wire, asked), None, split_runs(collapsed)
            views = valid_views(wire, folded, views)
        refolded: list[str] = []
        # the default folds' graph draws its elements: as many as fit, nothing to fold again (no module tree).
        # A module opened into its calls draws a few of them: counted as folded here
        if max_drawn is not None and (vg is None or len(vg.elements) > max_drawn):
            inner = {f for f in folded if any(inside(f, m) for m in views)}  # in an opened call: kept as asked
            fitted, refolded = fit_drawn(wire, (folded - inner) | views.keys(), max_drawn, runs.opened)
            views = {m: v for m, v in views.items() if m in fitted}
            folded = (fitted - views.keys()) | {f for f in inner if any(inside(f, m) for m in views)}
        if refolded or vg is None:
            vg = collapse_graph(wire, folded, normalised=True, views=views, runs=runs)
        kept = Runs({r for r in runs.opened if r[0] in vg.boxes},  # those of a box still drawn
                    {g: n for g, n in runs.shown.items() if g[0] in vg.boxes})
        return {**_layout(wire, vg, sweeps, dx, dy, module_gap),
                "collapsed": fold_tokens(folded, views) + run_tokens(kept), "refolded": refolded}


def _layout(wire: Wire, vg: VisibleGraph, sweeps: int, dx: float, dy: float, module_gap: float) -> dict[str, Any]:
    index = {e: i for i, e in enumerate(vg.elements)}
    pairs = [(index[a], index[b]) for a, b in vg.edges]
    groups: list[Group] = [prefixes(vg.parent[e]) for e in vg.elements]
    layer = band_layers(groups, vg.boxes, pairs)
    proper = ProperGraph(layer, groups, pairs)
    rows: list[list[int]] = [[] for _ in range(max(layer, default=-1) + 1)]
    for v in range(len(proper.layer)):
        rows[proper.layer[v]].append(v)
    rows = order_layers(rows, proper, sweeps)
    sizes = [element_size(wire, e, vg.members.get(e), vg.labels.get(e)) for e in vg.elements]
    x = _place_x(rows, proper, [w for w, _ in sizes], dx, dx * module_gap)
    ys = layer_y(layer, groups, len(rows), dy)
    labels = {b: box_label(wire, b) for b in vg.boxes}
    separate_boxes(rows, proper, x, [ys[k] for k in layer], sizes, labels)
    lo = min(x, default=0.0)
    nodes: dict[str, dict[str, Any]] = {}
    for v, eid in enumerate(vg.elements):
        entry: dict[str, Any] = {"x": round(x[v] - lo, 2), "y": ys[layer[v]], "layer": layer[v],
                                 "parent": vg.parent[eid], "w": round(sizes[v][0], 1), "h": sizes[v][1]}
        if eid in vg.members:
            entry["members"] = vg.members[eid]
        if eid in vg.labels:
            entry["label"] = vg.labels[eid]
        nodes[eid] = entry
    edges = []
    for k, ((a, b), slots) in enumerate(vg.edges.items()):
        route = proper.routes[k]
        bends = [[round(x[d] - lo, 2), ys[proper.layer[d]]] for d in corners(route, x)]
        if route[0] != index[a]:  # an edge that points up runs its route backwards
            bends.reverse()
        edges.append({"id": f"e:{a}>{b}", "source": a, "target": b, "slots": [list(s) for s in slots],
                      "up": layer[index[a]] >= layer[index[b]], "bends": bends})
    return {"nodes": nodes, "boxes": dict(vg.boxes), "box_labels": labels, "edges": edges,
            "layers": len(rows), "crossings": count_crossings(proper.layer, x, proper.pairs),
            "width": max(x, default=0.0) - lo, "height": ys[-1] if rows else 0.0}


def _place_x(rows: list[list[int]], g: ProperGraph, widths: list[float], dx: float, extra: float) -> list[float]:
    """Brandes–Köpf coordinates (see `app.view.x_coordinates`): neighbours in a layer at least `dx` apart and
    never closer than their widths allow (plus `SPACING`)."""
    n_real = len(widths)
    dummy = [v >= n_real for v in range(len(g.layer))]
    half = [w / 2 for w in widths] + [0.0] * (len(g.layer) - n_real)

    def gap(a: int, b: int) -> float:
        # lanes of long edges pack tighter than nodes; modules keep a margin so boxes do not touch
        base = dx / 2 if dummy[a] or dummy[b] else dx
        base = max(base, half[a] + half[b] + SPACING)
        return base + (extra if g.groups[a] != g.groups[b] else 0.0)

    return x_coordinates(rows, g.above, g.below, dummy, gap)
