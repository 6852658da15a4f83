"""The graph panel: the step's elements, its execution order (the player's), the colour legend, a line of
counts and the find box's options, for the run, step, rank, colouring and folds the page shows.

First load: the layout already holds the newest step (`page.initial_state`), so no server callback runs
then except `fill_search` (the search options are not needed for the first paint). Every server callback
that fires during the page load competes with the first paint for the browser's main thread and the
server's.

A step of thousands of nodes would ship every node as a search option and keep the browser busy
indexing them (seconds at 10,000 nodes, during which a click on the graph waits); for such a step
`view.search_index` gives the first options only and what the user types is searched on the server
(`search_big_step`). The graph's "fit" and "zoom to selection" buttons work in the browser (assets/graph.js).
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, ctx, html, no_update

from gradscape.app import view
from gradscape.app.data import PageData
from gradscape.app.ui import ids
from gradscape.tracer.store import StoreError


def register(app: dash.Dash, data: PageData) -> None:
    # the player's position is not set here: in the browser, a new step of the same graph keeps it and
    # another graph opens fully executed (`gradscape.player`); set here too, it raced the person's keys
    @app.callback(Output(ids.GRAPH, "elements"), Output(ids.EXEC_ORDER, "data"), Output(ids.SLIDER, "max"),
                  Output(ids.LEGEND, "children"), Output(ids.GRAPH_INFO, "children"), Output(ids.SEARCH, "options"),
                  Input(ids.RUN_SELECT, "value"), Input(ids.STEP_SELECT, "value"), Input(ids.COLOR_BY, "value"),
                  Input(ids.COLLAPSED, "data"), Input(ids.RANK_SELECT, "value"), State(ids.SEARCH, "search_value"),
                  prevent_initial_call=True)
    def load_graph(run: str | None, step: int | None, color_by: str, collapsed: dict[str, Any] | None,
                   rank: int | None, typed: str | None) -> Any:
        # the search options belong to the step: a fold or a new colouring keeps them (the dropdown
        # re-indexes every option it is given, ~0.1 s in the browser for a 500-node step)
        # and so does the execution order (358 KB for a 10,000-node step): a fold or a first expand sends the
        # elements only, and the player finds each node's drawn element among them (assets/player.js)
        new_step = any(p.split(".")[0] in (ids.RUN_SELECT, ids.STEP_SELECT, ids.RANK_SELECT)
                       for p in ctx.triggered_prop_ids)
        elements, order, last, _value, legend, info, search = graph_payload(
            data, run, step, color_by, collapsed, with_search=new_step, rank=int(rank or 0), with_order=new_step)
        if not new_step:
            return elements, no_update, no_update, legend, info, no_update
        return elements, order, last, legend, info, _with_typed(data, run, step, int(rank or 0), search, typed)

    @app.callback(Output(ids.SEARCH, "options", allow_duplicate=True), Input(ids.SEARCH, "id"),
                  State(ids.RUN_SELECT, "value"), State(ids.STEP_SELECT, "value"), State(ids.RANK_SELECT, "value"),
                  prevent_initial_call="initial_duplicate")
    def fill_search(_id: Any, run: str | None, step: int | None, rank: int | None) -> Any:
        """The first load's search options (an `id` never changes, so this runs once per page;
        load_graph fills them on every later change)."""
        if ctx.triggered_id is not None or not run or step is None:
            return no_update
        try:
            return data.search_index(run, step, int(rank or 0))
        except StoreError:
            return no_update

    @app.callback(Output(ids.SEARCH, "options", allow_duplicate=True), Input(ids.SEARCH, "search_value"),
                  State(ids.RUN_SELECT, "value"), State(ids.STEP_SELECT, "value"), State(ids.RANK_SELECT, "value"),
                  State(ids.SEARCH, "value"), State(ids.SEARCH, "options"), prevent_initial_call=True)
    def search_big_step(query: str | None, run: str | None, step: int | None, rank: int | None, value: str | None,
                        options: list[dict[str, str]] | None) -> Any:
        if not query or not run or step is None:
            return no_update
        try:
            hits = _server_hits(data, run, step, int(rank or 0), query)
        except StoreError:
            return no_update
        if hits is None:
            return no_update  # every option is in the browser already
        kept = [o for o in options or [] if o.get("value") == value and o not in hits]
        return kept + hits


def _server_hits(data: PageData, run: str, step: int, rank: int, query: str) -> list[dict[str, str]] | None:
    """The step's options that match `query`, searched on the server; None for a step whose every option is in
    the browser (`view.SEARCH_ALL`)."""
    table = data.search_table(run, step, rank)
    return table.search(query, limit=view.SEARCH_HITS) if table.n_nodes > view.SEARCH_ALL else None


def _with_typed(data: PageData, run: str | None, step: int | None, rank: int, options: list[dict[str, str]],
                typed: str | None) -> list[dict[str, str]]:
    """A new step's first options, with the new step's hits of what is typed in the find box when its options are
    searched on the server (a streamed step would otherwise take the person's hits away as they pick one)."""
    hits = _server_hits(data, run, step, rank, typed) if typed and run and step is not None else None
    return options if hits is None else hits + [o for o in options if o not in hits]


def graph_payload(data: PageData, run: str | None, step: int | None, color_by: str | None,
                  collapsed: dict[str, Any] | None, with_search: bool = True, rank: int = 0,
                  with_order: bool = True) -> tuple[Any, ...]:
    """Everything the graph area shows for one step of one rank: elements, execution order (None without
    `with_order`), player range, legend, a line of counts and the search options (`[]` without
    `with_search`)."""
    if not run or step is None:
        return [], None, 0, 0, None, "no step selected", []
    try:
        wire = data.graph(run, step, rank)
    except StoreError as exc:
        return [], None, 0, 0, None, str(exc), []
    if color_by == view.DIFF and not view.has_comparison(wire):
        color_by = "norm"  # a step without the comparison (the colour select is set back: app/ui/compiled.py)
    folded = collapsed.get("collapsed") if collapsed and collapsed.get("run") == run else None
    layout = data.layout(run, step, folded, rank)
    marks = data.marks(run, step, color_by or "norm", rank)
    elements = view.cytoscape_elements(wire, layout, color_by or "norm", marks)
    order = data.order(run, step, rank) if with_order else None
    drawn = sum(1 for e in elements if "source" not in e.get("data", {}))
    folds = [f for f in layout["collapsed"] if "#" not in f]  # the rest: modules opened into their calls
    info = (f"{len(wire['nodes'])} autograd nodes, {len(wire['edges'])} edges; {drawn} drawn"
            + (f", {len(folds)} modules folded (click one to open it)" if folds else "")
            + "".join(f"; {m} stays folded: opened, it would draw over {view.MAX_DRAWN:,} nodes (find or step "
                      "to one of its nodes to see it in the inspector)" for m in layout["refolded"]))
    last = max(len(wire["execution"]) - 1, 0)  # a new graph opens fully executed; the player rewinds it
    return (elements, order, last, last, _legend(marks.legend), info,
            data.search_index(run, step, rank) if with_search else [])


def _legend(info: dict[str, Any]) -> Any:
    # a colouring's own key after the scale (the difference colouring's white and grey: app/view/compiled.py)
    key = [html.Span([html.Span(className="gs-swatch", style={"background": k["colour"]}), k["name"]],
                     className="gs-key-item") for k in info.get("key", [])]
    return [html.Span(info.get("title", "")), html.Span(info.get("min_label", "")),
            html.Div(className="bar", style={"background": info.get("css_gradient", "#ccc")}),
            html.Span(info.get("max_label", "")), *key]  # then "red border: NaN/Inf", fixed in the page (page.py)
