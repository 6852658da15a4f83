"""The step's autograd graph as a `networkx.DiGraph`, built from its wire form: the app side's graph model.

    g = step_graph(wire)                 # nodes: node ids; edges: gradient flow, loss side → leaves
    layers(g)                            # {node: longest-path layer from the loss}
    reachable(g, root) / upstream(g, n)  # descendants / ancestors
    by_module(g, {"blocks.3"})           # the graph with modules folded to one node each
    paths_to_loss(g, "fc1.weight")       # node paths from a loss root down to a parameter
    unreachable_params(g)                # model parameters no gradient reached

Edge direction: an edge `a → b` is the wire edge `[a, b, slot]`: `a` (nearer the loss) sent a
gradient to `b` through its output `slot`. Roots (where backward started) have no predecessor;
parameters' `AccumulateGrad` nodes have no successor. Every function here is a thin, documented use of
a networkx algorithm; the view never imports torch.

Node attributes: `name`, `kind`, `module` (drawn module, `None` at top level; an `AccumulateGrad`
belongs to the module owning its parameter), `param`, `order` (execution index, `None` when it did not
run), `label`. Edge attribute: `slots`, the list of output slots of `a` that feed `b`.
Graph attributes: `roots` (node ids where backward started), `params` (every parameter name of the model).

Readers: none in the page yet, only tests/app/test_view_layout.py. The layout (`layout.py`, `collapse.py`)
works on its own arrays (NOTE [networkx and what is hand-written here] in layout.py says why). The problem
finder does not read it and will not: it runs in the training process (tracer/debug/), which imports
nothing from app/, and before the step's wire form exists, so it builds its own networkx graph of the
recorder's nodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import networkx as nx

from gradscape.app.view.step_fields import Wire, node_label, node_module, prefixes

__all__ = ["by_module", "layers", "param_node", "paths_to_loss", "reachable", "roots", "step_graph",
           "unreachable_params", "upstream"]


def step_graph(wire: Wire) -> nx.DiGraph:
    """The step as a DiGraph (node ids are the wire's node ids, edges point away from the loss)."""
    g = nx.DiGraph()
    for n in wire["nodes"]:
        g.add_node(n["id"], name=n["name"], kind=n["kind"] or "op", module=node_module(n),
                   param=n["param"], order=n["order"], label=node_label(n, wire))
    for src, dst, slot in wire["edges"]:
        if g.has_edge(src, dst):
            g.edges[src, dst]["slots"].append(slot)
        else:
            g.add_edge(src, dst, slots=[slot])
    found = [r for p in wire["passes"] for r in p["roots"]]
    g.graph["roots"] = list(dict.fromkeys(found)) or [v for v in g if g.in_degree(v) == 0]
    names = set(wire["params"])
    for m in wire["modules"].values():
        names.update(m["params"])
    g.graph["params"] = sorted(names)
    return g


def roots(g: nx.DiGraph) -> list[int]:
    """Where backward started (the loss, or each output `backward` was called on)."""
    return list(g.graph.get("roots") or [])


def layers(g: nx.DiGraph) -> dict[Any, int]:
    """Longest-path layer of each node: 0 for the roots, and every edge goes to a higher layer.
    `nx.topological_generations` is exactly that layering. Raises `nx.NetworkXUnfeasible` on a cycle
    (an autograd graph has none; a folded one from `by_module` may)."""
    return {v: k for k, gen in enumerate(nx.topological_generations(g)) for v in gen}


def reachable(g: nx.DiGraph, node: Any) -> set[Any]:
    """Every node a gradient leaving `node` can reach (towards the leaves)."""
    return nx.descendants(g, node)


def upstream(g: nx.DiGraph, node: Any) -> set[Any]:
    """Every node whose gradient flows into `node` (towards the loss)."""
    return nx.ancestors(g, node)


def param_node(g: nx.DiGraph, param: str) -> int | None:
    """The `AccumulateGrad` node of a parameter, or None when the step has none (no gradient reached it)."""
    return next((v for v, p in g.nodes(data="param") if p == param), None)


def paths_to_loss(g: nx.DiGraph, param: str, limit: int = 100) -> list[list[int]]:
    """Up to `limit` paths (node ids, root first, the parameter's node last) along which the loss's
    gradient reached `param`; `[]` when none did. A residual network has exponentially many such
    paths, hence the limit; `upstream(g, param_node(g, param))` is the set of every node on any of them."""
    target = param_node(g, param)
    if target is None:
        return []
    out: list[list[int]] = []
    for r in roots(g):
        if len(out) >= limit:
            break
        if r == target:
            out.append([r])
            continue
        out.extend(itertools.islice(nx.all_simple_paths(g, r, target), limit - len(out)))
    return out


def unreachable_params(g: nx.DiGraph) -> list[str]:
    """Model parameters that no gradient reached from a root in this step (no `AccumulateGrad` node
    below a root): frozen, unused in the forward, or cut off by a `detach`."""
    seen: set[Any] = set()
    for r in roots(g):
        if r in g:
            seen.add(r)
            seen |= nx.descendants(g, r)
    reached = {g.nodes[v]["param"] for v in seen if g.nodes[v].get("param")}
    return [p for p in g.graph.get("params") or [] if p not in reached]


def by_module(g: nx.DiGraph, collapsed: Iterable[str]) -> nx.DiGraph:
    """The graph with each module in `collapsed` folded into one node `m:<module>` (via
    `nx.quotient_graph`'s blocks, built directly: a node in a folded module maps to the outermost
    folded prefix). Folded nodes carry `members` (node ids); edges inside one folded module vanish,
    edges between the same two drawn nodes merge. Folding can close a cycle (a module called twice)."""
    folded = set(collapsed)
    rep: dict[Any, Any] = {}
    q = nx.DiGraph(**g.graph)
    for v, module in g.nodes(data="module"):
        fold = next((p for p in prefixes(module) if p in folded), None)
        if fold is None:
            rep[v] = v
            q.add_node(v, **g.nodes[v])
        else:
            rep[v] = "m:" + fold
            if rep[v] not in q:
                q.add_node(rep[v], kind="module", module=fold, members=[])
            q.nodes[rep[v]]["members"].append(v)
    for a, b in g.edges:
        ra, rb = rep[a], rep[b]
        if ra != rb:
            q.add_edge(ra, rb)
    return q
