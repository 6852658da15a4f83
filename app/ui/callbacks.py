"""Dash callbacks for runs, steps and the graph, and `register`, which also registers the page's other callback
modules (app/ui/__init__.py lists them). Each callback is a few lines over `app.view` (which imports no Dash) and
the trace store.

Live data: the /ui socket (dash-socketio) only says *what changed* ("run r has step 12"); the
callbacks then read the current state from the store, so merged notifications lose nothing.

First load: the layout already holds the newest step (`initial_state`), so no server callback
runs then except `fill_search` (the search options are not needed for the first paint) and,
once the socket connects, the step list catching up on steps stored meanwhile (the server sends a
connecting page a `catchup` step event; see `gradscape.liveSteps`).
The others are `prevent_initial_call`: they answer changes only, and a deep link arrives as one
(the browser parses it, `gradscape.deepLink` in assets/player.js).
Every server callback that fires during the page load competes with the first paint for the
browser's main thread and the server's.

Ranks (torch.distributed): every view reads the rank in `#rank-select` (app/ui/compare.py), and every
read of a step is keyed by (run, step, rank). Outside torch.distributed the rank is always 0.
"""

from __future__ import annotations

from typing import Any

import dash
from dash import ClientsideFunction, Input, Output, State, ctx, html, no_update

from gradscape.app import view
from gradscape.app.ui import compare, ids, inspector, player, problems, selection
from gradscape.app.ui.address import link_rank
from gradscape.app.ui.data import UIData
from gradscape.tracer.store import StoreError, TraceStore
from gradscape.tracer.wire import WireStep


def _exec_order(wire: WireStep, layout: dict[str, Any], rank: int = 0) -> dict[str, Any]:
    """Per execution index: the node id and the drawn element that shows it (itself or its folded
    module), so the player highlights what is on screen; with the run, rank and step it belongs to (the
    player selects its current node there, in the browser)."""
    elements, nodes = [], []
    for nid, _run in wire["execution"]:
        el = view.visible_element(layout, f"n{nid}")
        elements.append(el)
        nodes.append(nid)
    names = [wire["nodes"][n]["name"] for n in nodes]
    return {"run": wire["run"], "rank": int(rank), "step": wire["step"], "elements": elements, "nodes": nodes,
            "names": names}


def register(app: dash.Dash, store: TraceStore) -> UIData:
    data = UIData(store)
    compare.register(app, store)  # rank select and compare view

    # ?run=&rank=&step=&node= → {run, rank, step, node} in ids.DEEP_LINK, or nothing without a link (the page
    # was rendered with the newest step already). Set with set_props, not as this callback's output: the
    # selection callbacks write the address (ids.URL) and read the link, so a declared output closed a loop
    # in Dash's callback graph. Dash holds back a callback while one upstream of its inputs is pending, and
    # in that loop each one is upstream of itself: Dash broke the loop only when nothing else was in flight,
    # so a click answered while another callback was in flight left the inspector and the graph's focus
    # waiting for the next notification (tests/app/test_callback_graph.py)
    app.clientside_callback(ClientsideFunction("gradscape", "deepLink"), Input(ids.URL, "search"),
                            State(ids.SELECTED, "data"))

    @app.callback(Output(ids.RUN_SELECT, "options"), Output(ids.RUN_SELECT, "value"),
                  Input(ids.DEEP_LINK, "data"), State(ids.RUN_SELECT, "value"),
                  prevent_initial_call=True)  # first load: the layout already holds the runs
    def sync_runs(link: dict[str, Any] | None, current: str | None) -> tuple[Any, Any]:
        return run_choices(store, link, current)

    # A new run, announced on the socket → the run list, read from the JSON API in the browser (for the
    # same reason as the step list below: no server callback whose answer Dash may drop)
    app.clientside_callback(ClientsideFunction("gradscape", "liveRuns"), Output(ids.LIVE_RUNS, "data"),
                            Input(ids.SOCKET, "data-run"), State(ids.RUN_SELECT, "value"),
                            prevent_initial_call=True)

    @app.callback(Output(ids.STEP_SELECT, "options"), Output(ids.STEP_SELECT, "value"),
                  Input(ids.RUN_SELECT, "value"), Input(ids.DEEP_LINK, "data"), Input(ids.RANK_SELECT, "value"),
                  State(ids.STEP_SELECT, "value"),
                  prevent_initial_call=True)  # first load: the layout already holds the steps
    def sync_steps(run: str | None, link: dict[str, Any] | None, rank: int | None,
                   current: int | None) -> tuple[Any, Any]:
        """The steps of the run's shown rank (the rank is set first: `compare.sync_ranks`)."""
        fired = ctx.triggered_prop_ids  # several can change in one update: the deep link wins
        trigger = ids.DEEP_LINK if f"{ids.DEEP_LINK}.data" in fired else ids.RUN_SELECT
        return step_choices(store, run, link, current, trigger, int(rank or 0))

    # A `step` notification (or the server's catch-up when the socket (re)connects) → the steps of the
    # shown rank, read from the JSON API in the browser and set on the step list there. Not a server
    # callback: Dash drops the answer of a callback whose input changes again while it is in flight, and
    # notifications arrive whenever training sends them (a lost update left the list a step behind).
    # Another run or rank chosen only tells the browser which list an answer must be for.
    app.clientside_callback(ClientsideFunction("gradscape", "liveSteps"), Output(ids.LIVE_STEPS, "data"),
                            Input(ids.SOCKET, "data-step"), Input(ids.RUN_SELECT, "value"),
                            Input(ids.RANK_SELECT, "value"), State(ids.STEP_SELECT, "value"),
                            State(ids.STEP_SELECT, "options"), State(ids.FOLLOW, "value"),
                            State(ids.RANK_SELECT, "options"), prevent_initial_call=True)

    # the player's position is not set here: in the browser, a new step of the same graph keeps it and
    # another graph opens fully executed (`gradscape.player`); set here too, it raced the person's keys
    @app.callback(Output(ids.GRAPH, "elements"), Output(ids.EXEC_ORDER, "data"), Output(ids.SLIDER, "max"),
                  Output(ids.LEGEND, "children"), Output(ids.GRAPH_INFO, "children"), Output(ids.SEARCH, "options"),
                  Input(ids.RUN_SELECT, "value"), Input(ids.STEP_SELECT, "value"), Input(ids.COLOR_BY, "value"),
                  Input(ids.COLLAPSED, "data"), Input(ids.RANK_SELECT, "value"), prevent_initial_call=True)
    def load_graph(run: str | None, step: int | None, color_by: str, collapsed: dict[str, Any] | None,
                   rank: int | None) -> Any:
        # the search options belong to the step: a fold or a new colouring keeps them (the dropdown
        # re-indexes every option it is given, ~0.1 s in the browser for a 500-node step)
        new_step = any(p.split(".")[0] in (ids.RUN_SELECT, ids.STEP_SELECT, ids.RANK_SELECT)
                       for p in ctx.triggered_prop_ids)
        elements, order, last, _value, legend, info, search = graph_payload(
            data, run, step, color_by, collapsed, with_search=new_step, rank=int(rank or 0))
        return elements, order, last, legend, info, search if new_step else no_update

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

    # "live" (with the tracer's counts) / "offline" / "connecting…", in the browser: tracer status
    # notifications arrive up to ten times a second
    app.clientside_callback(ClientsideFunction("gradscape", "connection"), Output(ids.CONNECTION, "children"),
                            Output(ids.CONNECTION, "className"), Input(ids.SOCKET, "connected"),
                            Input(ids.SOCKET, "data-tracer"))

    selection.register(app, data)  # node selection and folds (app/ui/selection.py)
    inspector.register(app, data)  # the inspector (app/ui/inspector.py)
    player.register(app)  # the backward player and focus (app/ui/player.py)
    problems.register(app, data)  # the problems panel (app/ui/problems.py)
    return data


def run_choices(store: TraceStore, link: dict[str, Any] | None, current: str | None) -> tuple[Any, Any]:
    runs = sorted(store.runs(), key=lambda r: r["updated"])
    names = [r["run"] for r in runs]
    options = [{"label": f"{r['run']} ({r['steps']} steps)", "value": r["run"]} for r in runs]
    if link and link.get("run") in names:
        return options, link["run"]
    if current in names:
        return options, current
    return options, names[-1] if names else None


def step_choices(store: TraceStore, run: str | None, link: dict[str, Any] | None, current: int | None,
                 trigger: Any = None, rank: int = 0) -> tuple[Any, Any]:
    """The steps of the run's `rank` as options, and the one to show: a deep link's (naming this run and
    rank), else the current one, else the newest. (Live notifications are handled in the browser:
    `gradscape.liveSteps`.)"""
    if not run:
        return [], None
    steps = [s["step"] for s in store.steps(run, rank)]
    options = [{"label": f"step {s}", "value": s} for s in steps]
    if not steps:
        return options, None
    if link and link.get("run") == run and link_rank(link) == rank and link.get("step") in steps and \
            (current is None or trigger == ids.DEEP_LINK):
        return options, link["step"]
    if current not in steps:
        return options, steps[-1]
    return options, current


def graph_payload(data: UIData, run: str | None, step: int | None, color_by: str | None,
                  collapsed: dict[str, Any] | None, with_search: bool = True, rank: int = 0) -> tuple[Any, ...]:
    """Everything the graph area shows for one step of one rank: elements, execution order, player
    range, legend, a line of counts and the search options (`[]` without `with_search`)."""
    if not run or step is None:
        return [], None, 0, 0, None, "no step selected", []
    try:
        wire = data.graph(run, step, rank)
    except StoreError as exc:
        return [], None, 0, 0, None, str(exc), []
    folded = collapsed.get("collapsed") if collapsed and collapsed.get("run") == run else None
    layout = data.layout(run, step, folded, rank)
    elements = view.cytoscape_elements(wire, layout, color_by or "norm")
    order = _exec_order(wire, layout, rank)
    drawn = sum(1 for e in elements if "source" not in e.get("data", {}))
    info = (f"{len(wire['nodes'])} autograd nodes, {len(wire['edges'])} edges; {drawn} drawn"
            + (f", {len(layout['collapsed'])} modules folded (click one to open it)" if layout["collapsed"] else ""))
    last = max(len(order["nodes"]) - 1, 0)  # a new graph opens fully executed; the player rewinds it
    return (elements, order, last, last, _legend(view.legend(wire, color_by or "norm")), info,
            data.search_index(run, step, rank) if with_search else [])


def initial_state(data: UIData) -> dict[str, Any]:
    """The page as first served: the newest run and step already drawn (of the run's first rank, which
    the rank select shows), so the first paint needs no callback round trip (a deep link then moves it,
    in the browser)."""
    run_options, run = run_choices(data.store, None, None)
    ranks = data.store.ranks(run) if run else []
    rank = compare.rank_field(ranks)[1]
    step_options, step = step_choices(data.store, run, None, None, rank=rank)
    elements, order, last, value, legend, info, _ = graph_payload(data, run, step, "norm", None, with_search=False,
                                                                  rank=rank)
    player = (f"#{value} of {len(order['nodes'])}: {order['names'][value]} (n{order['nodes'][value]})"
              if order and order["nodes"] else "")
    # the inspector opens on the player's node, so the two agree from the first paint
    selected = ({"run": run, "rank": rank, "step": step, "node": order["nodes"][value]}
                if order and order["nodes"] else None)
    panel = inspector.inspector_payload(data, selected) if selected else None
    return {"run_options": run_options, "run": run, "step_options": step_options, "step": step,
            "elements": elements, "order": order, "slider_max": last, "slider_value": value, "legend": legend,
            "info": info, "player": player, "selected": selected, "inspector": panel,
            "problems": problems.lines_of(data, run, step, rank),  # the problems panel (app/ui/problems.py)
            "ranks": ranks}


def _legend(info: dict[str, Any]) -> Any:
    return [html.Span(info.get("title", "")), html.Span(info.get("min_label", "")),
            html.Div(className="bar", style={"background": info.get("css_gradient", "#ccc")}),
            html.Span(info.get("max_label", "")), html.Span("red border: NaN/Inf", className="gs-nan")]


