"""Node selection and folds: a click on the graph, a pick in the find box, a deep link, a new step or rank.

Three callbacks, one per source, over one pure function (`selection`). The player selects its current
node, and a click on a node selects it, in the browser as well (assets/player.js).
"""

from __future__ import annotations

from typing import Any

import dash
from dash import ClientsideFunction, Input, Output, State, ctx, no_update

from gradscape.app import view
from gradscape.app.data import PageData
from gradscape.app.ui import ids
from gradscape.app.ui.address import address, link_rank
from gradscape.app.view import ids as element
from gradscape.tracer.store import StoreError


def register(app: dash.Dash, data: PageData) -> None:
    # Node selection and folds. Three callbacks, one per source, because Dash drops the answer of a
    # callback whose input changes while it is in flight and asks again with only the newest trigger:
    # with the step list as an input of the same callback, a streamed step arriving during a click on a
    # module box or a pick in the find box lost that click. The player selects its current node, and a
    # click on a node selects it, in the browser as well (assets/player.js).
    @app.callback(Output(ids.SELECTED, "data"), Output(ids.COLLAPSED, "data"), Output(ids.URL, "search"),
                  Output(ids.LINK_USED, "data"),
                  Input(ids.DEEP_LINK, "data"), Input(ids.STEP_SELECT, "value"), Input(ids.RANK_SELECT, "value"),
                  State(ids.RUN_SELECT, "value"), State(ids.SELECTED, "data"), State(ids.COLLAPSED, "data"),
                  State(ids.LINK_USED, "data"), prevent_initial_call=True)  # first load: nothing is selected yet
    def select_for_step(link: dict[str, Any] | None, step: int | None, rank: int | None, run: str | None,
                        selected: dict[str, Any] | None, collapsed: dict[str, Any] | None,
                        used: dict[str, Any] | None) -> Any:
        """A deep link's node once its run, rank and step are shown (once: a later visit to that step keeps
        what the person selected since); the same node in a new step or rank (when it has one)."""
        # a deep link sets the run, rank and step before it reaches here, all in one update: it wins
        fired = [p.split(".")[0] for p in ctx.triggered_prop_ids]
        trigger = next((t for t in (ids.DEEP_LINK, ids.STEP_SELECT, ids.RANK_SELECT) if t in fired), None)
        fresh = link if link and link != used else None
        sel, folded, where = selection(data, trigger, run, step, int(rank or 0), selected, collapsed, link=fresh)
        applied = fresh is not None and isinstance(sel, dict) and sel.get("step") == fresh.get("step") \
            and sel.get("node") == fresh.get("node")
        return sel, folded, where, fresh if applied else no_update

    def selecting(source: Input) -> list[Any]:
        """The selection, folds and address, set from `source` with what the page shows as its state."""
        return [Output(ids.SELECTED, "data", allow_duplicate=True), Output(ids.COLLAPSED, "data", allow_duplicate=True),
                Output(ids.URL, "search", allow_duplicate=True), source,
                State(ids.RUN_SELECT, "value"), State(ids.STEP_SELECT, "value"), State(ids.RANK_SELECT, "value"),
                State(ids.SELECTED, "data"), State(ids.COLLAPSED, "data")]

    @app.callback(*selecting(Input(ids.GRAPH, "tapNodeData")), prevent_initial_call=True)
    def select_in_graph(tap: dict[str, Any] | None, run: str | None, step: int | None, rank: int | None,
                        selected: dict[str, Any] | None, collapsed: dict[str, Any] | None) -> Any:
        """A click on the graph: a node selects it, a folded module opens a level, a box folds."""
        return selection(data, ids.GRAPH, run, step, int(rank or 0), selected, collapsed, tap=tap)

    # a node found is also picked in the browser at once (`searchPick`, assets/links.js): numbered there, so a
    # new step's answer from the state before it does not take it back
    app.clientside_callback(ClientsideFunction("gradscape", "searchPick"), Input(ids.SEARCH, "value"),
                            prevent_initial_call=True)

    @app.callback(*selecting(Input(ids.SEARCH, "value")), prevent_initial_call=True)
    def select_found(found: str | None, run: str | None, step: int | None, rank: int | None,
                     selected: dict[str, Any] | None, collapsed: dict[str, Any] | None) -> Any:
        """A pick in the find box: a node is selected and unfolded into view, a module is opened."""
        return selection(data, ids.SEARCH, run, step, int(rank or 0), selected, collapsed, found=found)


def selection(data: PageData, trigger: Any, run: str | None, step: int | None, rank: int,
              selected: dict[str, Any] | None, collapsed: dict[str, Any] | None, tap: dict[str, Any] | None = None,
              found: str | None = None, link: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """(selected node, folded modules, address) after a click (`tap`), a find (`found`), a deep link, or a
    step or rank change (`trigger` says which); `no_update` for what does not change."""
    if not run or step is None:
        return no_update, no_update, no_update
    try:
        wire = data.graph(run, step, rank)
    except StoreError:
        return no_update, no_update, no_update
    folded = collapsed.get("collapsed") if collapsed and collapsed.get("run") == run else None
    current = data.layout(run, step, folded, rank)["collapsed"]
    node: int | None = None
    new_folded: list[str] | None = None
    if trigger == ids.GRAPH and tap:
        el = str(tap.get("id", ""))
        if (folds := view.after_tap(wire, current, el)) is not None:  # a fold, a folded call or a box
            return no_update, {"run": run, "collapsed": folds}, no_update
        node = element.node_of(el)
    elif trigger == ids.SEARCH and found:
        if (node := element.node_of(found)) is not None:
            new_folded = view.reveal_node(wire, current, node)
        elif (module := element.module_of(found)) is not None:
            new_folded = sorted(view.expand_module(current, module))
    elif trigger in (ids.DEEP_LINK, ids.STEP_SELECT, ids.RANK_SELECT) and link and link.get("run") == run \
            and link_rank(link) == rank and link.get("step") == step and link.get("node") is not None \
            and (trigger == ids.DEEP_LINK or not selected or selected.get("step") != step):
        node = link["node"]  # the page was opened from a deep link: once run, rank and step are in place
        new_folded = view.reveal_node(wire, current, node) if 0 <= node < len(wire["nodes"]) else None
    kept = False
    if node is None and trigger in (ids.STEP_SELECT, ids.RANK_SELECT) and selected and selected.get("run") == run:
        node, kept = selected.get("node"), True  # same node, new step or rank (ids are stable for the same model)
    if trigger in (ids.DEEP_LINK, ids.STEP_SELECT, ids.RANK_SELECT) and selected and \
            (node is None or not 0 <= node < len(wire["nodes"])) and \
            (selected.get("run") != run or not 0 <= (selected.get("node") or 0) < len(wire["nodes"])):
        # the node shown is of another run (or not in this step): the player's node of the step shown
        # instead (where a new graph opens: fully run), never a node this run or step does not have
        order = data.order(run, step, rank)["nodes"]
        node, kept = (order[-1] if order else None), False
    if node is None or not 0 <= node < len(wire["nodes"]):
        return no_update, ({"run": run, "collapsed": new_folded} if new_folded is not None else no_update), \
            no_update
    # `kept`: the node is the one the request's state held, which the person may have moved on from (the
    # player, a click: picks made in the browser, numbered there) while this was answered; `pick` is the
    # number of the browser's pick that state came from. The browser keeps a newer pick (`focus`,
    # assets/player.js)
    sel = {"run": run, "rank": rank, "step": step, "node": node, "pick": (selected or {}).get("pick") or 0,
           **({"kept": True} if kept else {})}
    folded_out = {"run": run, "collapsed": new_folded} if new_folded is not None and new_folded != current \
        else no_update
    return sel, folded_out, address(sel)
