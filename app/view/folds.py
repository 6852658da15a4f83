"""What a click on the graph, or a node found, does to the page's fold list (`app.ui.ids.COLLAPSED`): the module
prefixes folded, the modules opened into their calls (tokens of `app.view.call_folds`) and the runs of ops
opened (`app.view.op_runs`).

A click on a folded module opens it: a module called many times into its calls (`cell · call 17 of 300`,
the first `CALLS_SHOWN`), any other one level (`collapse.expand_one_level`: its own submodules stay
folded). A click on a folded call opens it into its ops, one on the calls not drawn yet draws the next
ones, one on a run of ops (`scan · ops 101–200 of 10,000`) draws its ops. A click on a module's box folds
its runs opened back, when it has some, else its calls opened into ops, else the module; one on an opened
call's box (`cell · call 17 of 300`) folds that call back alone.
Every click on a fold changes what is drawn.
"""

from __future__ import annotations

from collections.abc import Iterable

from gradscape.app.view.call_folds import (
    CallView,
    fold_call,
    fold_calls,
    fold_tokens,
    fold_whole,
    open_call,
    open_into_calls,
    opens_into_calls,
    reveal_in_calls,
    show_more,
    split_folds,
    valid_views,
)
from gradscape.app.view.collapse import _ModuleTree, collapse_graph, expand_module, normalise
from gradscape.app.view.ids import box_of, call_of, module_of, run_of
from gradscape.app.view.op_runs import RUNS_FROM, fold_runs, open_run, run_tokens, split_runs
from gradscape.app.view.step_fields import Wire, inside, node_module, prefixes

__all__ = ["after_tap", "open_module", "reveal_node"]


def open_module(wire: Wire, collapsed: Iterable[str], prefix: str) -> list[str]:
    """Folded `prefix` opened: into its calls when it was called more than once and holds enough nodes
    (`call_folds.opens_into_calls`), else one level."""
    folds, views = split_folds(collapsed)
    tree = _ModuleTree(wire)
    if opens_into_calls(wire, prefix, tree.size.get(prefix, 0)):
        return open_into_calls(expand_module(folds, prefix), views, prefix)
    return fold_tokens(expand_module(folds, prefix) | tree.coarsest(tree.children.get(prefix, [])), views)


def after_tap(wire: Wire, collapsed: Iterable[str], element: str) -> list[str] | None:
    """The fold list after a click on `element`; None when the element is no fold or box (a node)."""
    collapsed = list(collapsed)
    if (run := run_of(element)) is not None:
        return open_run(collapsed, run)
    runs = run_tokens(split_runs(collapsed))  # kept through the changes below (a run folded away is dropped
    if (module := module_of(element)) is not None:  # by the layout)
        return open_module(wire, collapsed, module) + runs
    folds, views = split_folds(collapsed)
    if (box := box_of(element)) is not None:  # its opened runs and calls fold back first, then the module whole
        if (one := fold_call(folds, views, box)) is not None:  # an opened call's box: its runs, then the call
            return fold_runs(collapsed, box) or one + runs
        return (fold_runs(collapsed, box) or (fold_calls(folds, views, box) or fold_whole(folds, views, box))
                + runs)
    if (call := call_of(element)) is not None:
        owner, k = call
        return (open_call(folds, views, owner, k) if k is not None else show_more(wire, folds, views, owner)) + runs
    return None


def reveal_node(wire: Wire, collapsed: Iterable[str], node_id: int) -> list[str]:
    """Whatever hides node `node_id` unfolded: the folds around it, its call when a module opened into
    its calls holds it, and its run of ops when its box draws them in runs (a search hit or a deep link)."""
    collapsed = list(collapsed)
    tokens = _reveal_folds(wire, collapsed, node_id) + run_tokens(split_runs(collapsed))
    module = node_module(wire["nodes"][node_id])
    if module is None or _ModuleTree(wire).own(module) <= RUNS_FROM:
        return tokens
    folds, views = split_folds(tokens)
    folded = normalise(wire, folds)
    vg = collapse_graph(wire, folded, normalised=True, views=valid_views(wire, folded, views),
                        runs=split_runs(tokens), every_run=True)
    run = run_of(vg.rep[node_id])
    return open_run(tokens, run) if run is not None else tokens


def _reveal_folds(wire: Wire, collapsed: list[str], node_id: int) -> list[str]:
    """The module folds and calls around node `node_id` opened."""
    folds, views = split_folds(collapsed)
    module = node_module(wire["nodes"][node_id])
    kept = {p for p in folds if not inside(module, p)}
    if kept != folds:  # a folded module called many times around it opens into its calls, not whole
        tree = _ModuleTree(wire)
        opened = [q for q in prefixes(module) if any(inside(q, p) for p in folds - kept)]
        many = next((q for q in opened if opens_into_calls(wire, q, tree.size.get(q, 0))), None)
        if many is not None and many not in views:
            views = {**views, many: CallView()}
    return fold_tokens(kept, reveal_in_calls(wire, views, node_id))
