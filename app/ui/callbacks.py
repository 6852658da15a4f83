"""Dash callbacks: each a few lines over `app.view` (which imports no Dash) and the trace store.

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

import threading
from collections import OrderedDict
from typing import Any

import dash
from dash import ClientsideFunction, Input, Output, State, ctx, dcc, html, no_update

from app import view
from app.ui import compare, ids, problems
from app.ui.address import address, link_rank
from tracer.store import StoreError, TraceStore

MAX_STEPS_OVER_TIME = 30
HINT = "Click a node of the graph (or step through the backward pass) to see what arrived at it and what it sent on."


class UIData:
    """Reads for the page, with a small LRU of decoded step graphs and their layouts. Every entry is
    keyed by (run, step, rank): the ranks of one step are different traces (their own batches)."""

    def __init__(self, store: TraceStore, size: int = 6) -> None:
        self.store = store
        self.size = size
        self._graphs: OrderedDict[tuple[str, int, int], dict[str, Any]] = OrderedDict()
        self._layouts: OrderedDict[tuple[str, int, int, tuple[str, ...] | None], dict[str, Any]] = OrderedDict()
        self._flows: OrderedDict[tuple[str, int, int], dict[str, Any]] = OrderedDict()
        self._search: OrderedDict[tuple[str, int, int], list[dict[str, str]]] = OrderedDict()
        self._lock = threading.Lock()

    def _lru(self, cache: OrderedDict[Any, Any], key: Any, make: Any) -> Any:
        with self._lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        value = make()
        with self._lock:
            cache[key] = value
            while len(cache) > self.size:
                cache.popitem(last=False)
        return value

    def graph(self, run: str, step: int, rank: int = 0) -> dict[str, Any]:
        return self._lru(self._graphs, (run, int(step), int(rank)),
                         lambda: self.store.read_graph(run, int(step), int(rank)))

    def search_index(self, run: str, step: int, rank: int = 0) -> list[dict[str, str]]:
        return self._lru(self._search, (run, int(step), int(rank)),
                         lambda: view.search_index(self.graph(run, step, rank)))

    def flow_over_steps(self, run: str, step: int, rank: int = 0) -> dict[str, Any]:
        """Per-layer gradient norm over the rank's last steps up to `step`: read once per (run, step,
        rank), not on every node click (it decodes up to MAX_STEPS_OVER_TIME stored steps)."""
        def make() -> dict[str, Any]:
            steps = [s["step"] for s in self.store.steps(run, int(rank)) if s["step"] <= step][-MAX_STEPS_OVER_TIME:]
            return view.norm_over_steps([self.store.read_graph(run, s, int(rank)) for s in steps])
        return self._lru(self._flows, (run, int(step), int(rank)), make)

    def layout(self, run: str, step: int, collapsed: list[str] | None, rank: int = 0) -> dict[str, Any]:
        key = (run, int(step), int(rank), None if collapsed is None else tuple(sorted(collapsed)))
        return self._lru(self._layouts, key, lambda: view.layout_graph(self.graph(run, step, rank), collapsed))


def _exec_order(wire: dict[str, Any], layout: dict[str, Any], rank: int = 0) -> dict[str, Any]:
    """Per execution index: the node id and the drawn element that shows it (itself or its folded
    module), so the player highlights what is on screen; with the run, rank and step it belongs to (the
    player selects its current node there, in the browser)."""
    elements, nodes = [], []
    for nid, _run in wire.get("execution") or []:
        el = view.visible_element(layout, f"n{nid}")
        elements.append(el)
        nodes.append(nid)
    names = [wire["nodes"][n]["name"] for n in nodes]
    return {"run": wire["run"], "rank": int(rank), "step": wire["step"], "elements": elements, "nodes": nodes,
            "names": names}


def register(app: dash.Dash, store: TraceStore) -> UIData:
    data = UIData(store)
    compare.register(app, store)  # rank select and compare view

    # ?run=&rank=&step=&node= → {run, rank, step, node}, or no update without a link (the page was rendered
    # with the newest step already)
    app.clientside_callback(ClientsideFunction("gradscape", "deepLink"), Output(ids.DEEP_LINK, "data"),
                            Input(ids.URL, "search"), State(ids.SELECTED, "data"))

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

    @app.callback(*selecting(Input(ids.SEARCH, "value")), prevent_initial_call=True)
    def select_found(found: str | None, run: str | None, step: int | None, rank: int | None,
                     selected: dict[str, Any] | None, collapsed: dict[str, Any] | None) -> Any:
        """A pick in the find box: a node is selected and unfolded into view, a module is opened."""
        return selection(data, ids.SEARCH, run, step, int(rank or 0), selected, collapsed, found=found)

    @app.callback(Output(ids.INSPECTOR, "children"), Output(ids.SAMPLE, "options"), Output(ids.SAMPLE, "style"),
                  Input(ids.SELECTED, "data"), Input(ids.SAMPLE, "value"), prevent_initial_call=True)
    def inspect(selected: dict[str, Any] | None, sample: int | None) -> Any:
        if not selected:  # cleared (Esc): the hint again
            return [html.P(HINT, className="gs-hint")], [], {"display": "none"}
        return inspector_payload(data, selected, sample)

    # "live" (with the tracer's counts) / "offline" / "connecting…", in the browser: tracer status
    # notifications arrive up to ten times a second
    app.clientside_callback(ClientsideFunction("gradscape", "connection"), Output(ids.CONNECTION, "children"),
                            Output(ids.CONNECTION, "className"), Input(ids.SOCKET, "connected"),
                            Input(ids.SOCKET, "data-tracer"))

    @app.callback(Output(ids.TICKER, "disabled"), Output(ids.PLAY, "children"), Output(ids.TICKER, "interval"),
                  Input(ids.PLAY, "n_clicks"), Input(ids.SPEED, "value"), State(ids.TICKER, "disabled"),
                  prevent_initial_call=True)
    def play(n: int | None, speed: int | None, disabled: bool) -> tuple[bool, str, int]:
        if ctx.triggered_id == ids.PLAY:
            disabled = not disabled
        return disabled, ("▶" if disabled else "❚❚"), int(speed or 400)

    app.clientside_callback(ClientsideFunction("gradscape", "advance"), Output(ids.SLIDER, "value"),
                            Input(ids.TICKER, "n_intervals"), Input(ids.PREV, "n_clicks"),
                            Input(ids.NEXT, "n_clicks"), State(ids.SLIDER, "value"), State(ids.SLIDER, "max"),
                            prevent_initial_call=True)
    app.clientside_callback(ClientsideFunction("gradscape", "player"), Output(ids.PLAYER_INFO, "children"),
                            Input(ids.SLIDER, "value"), Input(ids.EXEC_ORDER, "data"), Input(ids.GRAPH, "elements"),
                            State(ids.SLIDER, "max"))
    app.clientside_callback(ClientsideFunction("gradscape", "focus"), Output(ids.GRAPH, "className"),
                            Input(ids.SELECTED, "data"), Input(ids.EXEC_ORDER, "data"))
    problems.register(app, data)  # the problems panel (app/ui/problems.py)
    return data


def selection(data: UIData, trigger: Any, run: str | None, step: int | None, rank: int,
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
        if el.startswith("m:"):
            return no_update, {"run": run, "collapsed": sorted(view.expand_one_level(wire, current, el[2:]))}, \
                no_update
        if el.startswith("g:"):
            return no_update, {"run": run, "collapsed": sorted(view.collapse_module(current, el[2:]))}, no_update
        if el.startswith("n") and el[1:].isdigit():
            node = int(el[1:])
    elif trigger == ids.SEARCH and found:
        if found.startswith("n") and found[1:].isdigit():
            node = int(found[1:])
            new_folded = sorted(view.reveal(wire, current, node))
        elif found.startswith("m:"):
            new_folded = sorted(view.expand_module(current, found[2:]))
    elif trigger in (ids.DEEP_LINK, ids.STEP_SELECT, ids.RANK_SELECT) and link and link.get("run") == run \
            and link_rank(link) == rank and link.get("step") == step and link.get("node") is not None \
            and (trigger == ids.DEEP_LINK or not selected or selected.get("step") != step):
        node = link["node"]  # the page was opened from a deep link: once run, rank and step are in place
        new_folded = sorted(view.reveal(wire, current, node)) if 0 <= node < len(wire["nodes"]) else None
    elif trigger in (ids.STEP_SELECT, ids.RANK_SELECT) and selected and selected.get("run") == run:
        node = selected.get("node")  # same node, new step or rank (ids are stable for the same model)
    if node is None or not 0 <= node < len(wire["nodes"]):
        return no_update, ({"run": run, "collapsed": new_folded} if new_folded is not None else no_update), \
            no_update
    sel = {"run": run, "rank": rank, "step": step, "node": node}
    folded_out = {"run": run, "collapsed": new_folded} if new_folded is not None and new_folded != current \
        else no_update
    return sel, folded_out, address(sel)


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


def inspector_payload(data: UIData, selected: dict[str, Any], sample: int | None = None) -> tuple[Any, Any, Any]:
    """The inspector for one selected node (of its `rank`, 0 when it names none): its panel, and the
    sample choices (hidden without a 4-D tensor)."""
    hidden = {"display": "none"}
    run, step, node = selected["run"], selected["step"], selected["node"]
    rank = int(selected.get("rank") or 0)
    try:
        wire = data.graph(run, step, rank)
    except StoreError as exc:
        return html.P(str(exc), className="gs-hint"), [], hidden
    if not 0 <= node < len(wire["nodes"]):
        return html.P(f"no node {node} in step {step}", className="gs-hint"), [], hidden
    module = wire["nodes"][node].get("module")
    wanted = set(view.node_tensors(wire, node))
    if module and module in (wire.get("modules") or {}):
        wanted |= set(view.module_tensors(wire, module))  # the module tab's heatmaps
    arrays = data.store.read_arrays(run, step, sorted(wanted), rank)
    panel = view.slot_figures(wire, node, arrays, sample=int(sample or 0))
    slots = panel["grad_outputs"]["slots"] + panel["grad_inputs"]["slots"]
    full_4d = [s for s in slots if len(s.get("shape") or []) == 4 and "full" in str(s.get("source"))]
    options = [{"label": f"sample {k}", "value": k} for k in range(min(full_4d[0]["shape"][0], 256))] \
        if full_4d else []
    return (_inspector(wire, node, panel, data.flow_over_steps(run, step, rank), arrays), options,
            {"width": "160px"} if full_4d else hidden)


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
    inspector = inspector_payload(data, selected) if selected else None
    return {"run_options": run_options, "run": run, "step_options": step_options, "step": step,
            "elements": elements, "order": order, "slider_max": last, "slider_value": value, "legend": legend,
            "info": info, "player": player, "selected": selected, "inspector": inspector,
            "problems": problems.lines_of(data, run, step, rank),  # the problems panel (app/ui/problems.py)
            "ranks": ranks}


def _legend(info: dict[str, Any]) -> Any:
    return [html.Span(info.get("title", "")), html.Span(info.get("min_label", "")),
            html.Div(className="bar", style={"background": info.get("css_gradient", "#ccc")}),
            html.Span(info.get("max_label", "")), html.Span("red border: NaN/Inf", className="gs-nan")]


def _stats_table(rows: list[dict[str, Any]]) -> Any:
    if not rows:
        return None
    return html.Table(className="gs-stats", children=[
        html.Tr([html.Th(r["stat"]) for r in rows]), html.Tr([html.Td(r["text"]) for r in rows])])


def _slot(slot: dict[str, Any], kind: str, index: int, call: int | None = None) -> Any:
    fig = slot.get("figure")
    body: list[Any] = [html.Div(f"{kind}[{index}] · {slot.get('title', '')}", className="gs-slot-title")]
    if slot.get("source"):
        body.append(html.Div(f"{slot.get('view', '')} · {slot['source']}", className="gs-slot-note"))
    if slot.get("note"):
        body.append(html.Div(slot["note"], className="gs-slot-note"))
    if fig is not None:
        # the graph's box as tall as the figure: a shorter box let the plot draw over the next heading
        body.append(dcc.Graph(figure=fig, config={"displayModeBar": False, "responsive": True},
                              className="gs-heatmap", style={"height": f"{fig['layout'].get('height', 320)}px"}))
    body.append(_stats_table(slot.get("stats") or []))
    key = {"type": "slot", "kind": kind, "index": index, **({"call": call} if call is not None else {})}
    return html.Div(body, className="gs-slot", id=key)


def _inspector(wire: dict[str, Any], node_id: int, panel: dict[str, Any], flow_steps: dict[str, Any],
               arrays: dict[int, Any] | None = None) -> Any:
    n = wire["nodes"][node_id]
    shapes_in = ", ".join("×".join(map(str, s)) if s else "—" for s in n.get("in_shapes") or []) or "—"
    shapes_out = ", ".join("×".join(map(str, s)) if s else "—" for s in n.get("out_shapes") or []) or "—"
    meta = html.Div(className="gs-meta", children=[
        html.Div([html.B(n["name"]), f"  (node n{node_id}, {n.get('kind')})",
                  f", ran #{n['order']}" if n.get("order") is not None else ", did not run in this backward",
                  # which process's trace this is (torch.distributed only: the ranks' gradients differ)
                  f" · rank {wire['rank']} of {wire.get('world_size')}" if wire.get("rank") is not None else ""]),
        html.Div(["schema: ", html.Code(n.get("schema") or "—")]),
        html.Div(f"module: {n.get('module') or '—'} · source: {n.get('source') or '—'}"
                 + (f" · parameter: {n['param']}" if n.get("param") else "")),
        html.Div(f"forward inputs: {shapes_in} → forward outputs: {shapes_out}"),
    ])
    slots_out = [_slot(s, "grad_outputs", i) for i, s in enumerate(panel["grad_outputs"]["slots"])]
    slots_in = [_slot(s, "grad_inputs", j) for j, s in enumerate(panel["grad_inputs"]["slots"])]
    node_tab = [meta, html.Div(panel["explain"], className="gs-explain"),
                html.H3(panel["grad_outputs"]["title"]), *slots_out,
                html.H3(panel["grad_inputs"]["title"]), *slots_in]
    tabs = [dcc.Tab(label="Node", value="node", children=node_tab)]
    module = n.get("module")
    if module and module in (wire.get("modules") or {}):
        tabs.append(dcc.Tab(label=f"Module {module}", value="module", children=_module_tab(wire, module, arrays)))
    tabs.append(dcc.Tab(label="Gradient flow", value="flow", children=[
        dcc.Graph(id=ids.FLOW, figure=view.gradient_flow(wire), config={"displayModeBar": False},
                  style={"height": "320px"}),
        dcc.Graph(id=ids.FLOW_STEPS, figure=flow_steps, config={"displayModeBar": False},
                  style={"height": "320px"})]))
    # the tab the person picked survives a new render (a streamed step re-renders the inspector): Dash's
    # persistence re-applies their choice while the value rendered here stays "node"
    return dcc.Tabs(id=ids.TABS, value="node", children=tabs, persistence=True, persistence_type="memory")


def _module_tab(wire: dict[str, Any], module: str, arrays: dict[int, Any] | None = None) -> list[Any]:
    d = view.module_detail(wire, module, arrays)
    out: list[Any] = [html.Div(f"{module} ({d.get('type')})", className="gs-meta"),
                      html.Div(d["backward_hook"]["text"], className="gs-explain")]
    for call in d["calls"]:
        out.append(html.H3(f"call {call['call']}: grad_output (∂L/∂ output)"))
        out.extend(_slot(s, "grad_output", k, call["call"])
                   for k, s in enumerate(call["slots"]["grad_output"]))
        out.append(html.H3(f"call {call['call']}: grad_input (∂L/∂ input, through this module only)"))
        out.extend(_slot(s, "grad_input", k, call["call"])
                   for k, s in enumerate(call["slots"]["grad_input"]))
    if d["params"]:
        out.append(html.H3("parameter gradients"))
        table = d["param_table"]
        out.append(html.Table(className="gs-table gs-params", children=[
            html.Tr([html.Th(c) for c in table["columns"]]),
            *[html.Tr([html.Td(v) for v in row]) for row in table["rows"]]]))
    return out
