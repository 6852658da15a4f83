"""The page layout: a header (run, step, colour, search, connection), the graph with the backward
player under it, and the inspector beside it. Styles live in assets/gradscape.css."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import dash_cytoscape as cyto
import flask
from dash import dcc, html
from dash_socketio import DashSocketIO

from gradscape.app import view
from gradscape.app.data import PageData
from gradscape.app.ui import compare, compiled, debugger, graph, ids, inspector, player, problems, runs, timeline
from gradscape.app.view.ids import node_element
from gradscape.tracer import protocol

STYLESHEET: list[dict[str, Any]] = [
    # sizes and label colours come from the data layer (app.view: room for each label, WCAG AA contrast)
    {"selector": "node", "style": {
        "label": "data(label)", "font-size": 12, "text-valign": "center", "text-halign": "center",
        "width": "data(w)", "height": "data(h)", "shape": "round-rectangle", "background-color": "data(fill)",
        "border-width": 1, "border-color": "#555", "color": "data(text_color)", "text-wrap": "ellipsis",
        "text-max-width": 236, "min-zoomed-font-size": 5}},
    {"selector": "node.param, node.leaf", "style": {"shape": "round-rectangle", "border-style": "dashed"}},
    {"selector": "node.root", "style": {"border-width": 3, "border-color": "#000", "font-weight": "bold"}},
    {"selector": "node.collapsed", "style": {"shape": "round-rectangle", "border-width": 3, "border-color": "#2b5d9c",
                                             "font-size": 13, "text-wrap": "wrap", "font-weight": "bold"}},
    {"selector": "node.more", "style": {"border-style": "dashed"}},  # calls not drawn yet (a click draws more)
    {"selector": "node.module", "style": {"background-opacity": 0.06, "background-color": "#2b5d9c",
                                       "border-color": "#2b5d9c", "border-width": 1, "label": "data(label)",
                                       "text-valign": "top", "text-halign": "center", "font-size": 12,
                                       "shape": "round-rectangle", "padding": 10}},
    {"selector": "node.nan", "style": {"border-color": "#d00", "border-width": 3}},
    {"selector": "node.compiled, node.checkpoint, node.custom", "style": {"shape": "rectangle",
                                                                         "border-style": "double"}},
    {"selector": "edge", "style": {"width": 1.2, "line-color": "#999", "target-arrow-color": "#999",
                                   "target-arrow-shape": "triangle", "curve-style": "bezier",
                                   "arrow-scale": 0.7}},
    {"selector": "edge.bent", "style": {"curve-style": "segments", "edge-distances": "node-position",
                                        "segment-distances": "data(bend_d)", "segment-weights": "data(bend_w)"}},
    {"selector": "node.notrun", "style": {"border-style": "dotted", "opacity": 0.6}},
    {"selector": ".pending", "style": {"opacity": 0.25}},
    {"selector": "node.executed", "style": {"opacity": 1}},
    # a NaN/Inf node at full strength wherever the player is (as the export, which has no player, draws it)
    {"selector": "node.nan", "style": {"opacity": 1}},
    # the parameter furthest from eager, under the colouring `compiled` (NOTE [Difference colouring])
    {"selector": "node.worstdiff", "style": {"border-color": "#08306b", "border-width": 5, "border-style": "solid"}},
    {"selector": "node.current", "style": {"border-color": "#ff8c00", "border-width": 5, "opacity": 1,
                                           "z-index": 10}},
    {"selector": "edge.incoming", "style": {"line-color": "#ff8c00", "target-arrow-color": "#ff8c00",
                                            "width": 3, "opacity": 1}},
    {"selector": "edge.outgoing", "style": {"line-color": "#1f77b4", "target-arrow-color": "#1f77b4",
                                            "width": 3, "opacity": 1}},
    {"selector": "node:selected", "style": {"border-color": "#7b2cbf", "border-width": 4}},
]


_SPLIT_ARIA: dict[str, Any] = {"aria-orientation": "vertical", "aria-label": "graph and inspector split"}


def layout_function(data: PageData, token: str | None) -> Callable[[], Any]:
    """The page as Dash's layout function. Dash calls it twice for a person's first visit: on the server's
    first request of any kind (the page's address), only to check the layout's ids; and for
    `/_dash-layout`, the page's content. Only the second draws the step; the first gets the page without
    one (the same ids). Drawn into both, a 100k-node step was decoded and laid out in the first (about
    2 s, holding back the page's HTML) and its payload made once more in the second."""
    def page_layout() -> Any:
        if flask.has_request_context() and not flask.request.path.endswith("/_dash-layout"):
            return layout(token)
        return layout(token, initial_state(data))
    return page_layout


def layout(token: str | None = None, state: dict[str, Any] | None = None) -> Any:
    """The page; `state` (from `initial_state`) pre-fills the newest step."""
    st = state or {}
    # WebSocket from the start (the tracer's own transport, so the server always has it): no
    # long-polling handshake competing with the first paint, one connection instead of several
    options: dict[str, Any] = {"transports": ["websocket"], **({"auth": {"token": token}} if token else {})}
    return html.Div(className="gs-page", children=[
        dcc.Location(id=ids.URL, refresh=False),
        DashSocketIO(id=ids.SOCKET, url=protocol.UI_NAMESPACE, options=options,
                     eventNames=list(protocol.UI_EVENTS)),
        dcc.Store(id=ids.DEEP_LINK), dcc.Store(id=ids.LINK_USED),
        dcc.Store(id=ids.SELECTED, data=st.get("selected")), dcc.Store(id=ids.INSPECTED, data=st.get("selected")),
        dcc.Store(id=ids.COLLAPSED),
        dcc.Store(id=ids.LIVE_STEPS), dcc.Store(id=ids.LIVE_RUNS),
        dcc.Store(id=ids.STEP_SET_BY_PAGE, data={"step": st.get("step")}),
        dcc.Store(id=ids.EXEC_ORDER, data=st.get("order")),
        _header(st),
        _band(),
        html.Div(className="gs-main", children=[
            html.Div(className="gs-left", children=_graph_area(st)),
            html.Div(id=ids.SPLIT, className="gs-split", role="separator", tabIndex="0",
                     title="drag (or ← →) to share the width between the graph and the inspector; "
                           "double-click: as it was", **_SPLIT_ARIA),
            html.Div(className="gs-right", children=[
                problems.panel(st.get("problems")),  # the problems panel (app/ui/problems.py)
                compiled.panel(st.get("compiled")),  # compiled against eager (app/ui/compiled.py)
                dcc.Store(id=ids.PROBLEM_PICK),  # the problem line last clicked (outside the panel, which re-renders)
                debugger.panel(),  # breakpoints (app/ui/debugger.py)
                compare.panel(st.get("ranks")),  # rank select and compare view (app/ui/compare.py)
                *_inspector(st),
            ]),
        ]),
    ])


def _band() -> Any:
    """The timeline (the run's history over every step, app/ui/timeline.py), with the connection status at
    the right of its title line: placed over it, so a status that grows as the tracer's counts come in
    moves nothing on the page (in the header it wrapped the header a line down a second after load)."""
    return html.Div(className="gs-band", children=[
        timeline.panel(), html.Div(id=ids.CONNECTION, className="gs-connection", children="connecting…")])


def _header(st: dict[str, Any]) -> Any:
    """Run, step, "next problem", "follow live", colour, find. (The connection status is on the timeline's
    line, where its counts can grow without moving anything: `_band`.)"""
    return html.Div(className="gs-header", children=[
        html.Div("gradscape", className="gs-title"),
        html.Label(["run", dcc.Dropdown(id=ids.RUN_SELECT, clearable=False, placeholder="no runs yet",
                                        options=st.get("run_options", []), value=st.get("run"))],
                   className="gs-field gs-run"),
        html.Label(["step", dcc.Dropdown(id=ids.STEP_SELECT, clearable=False, placeholder="—",
                                         options=st.get("step_options", []), value=st.get("step"))],
                   className="gs-field gs-step"),
        html.Button("next problem", id=ids.NEXT_PROBLEM, className="gs-btn gs-next-problem", n_clicks=0,
                    title="the next step a trigger traced or with problems, opened on its root-cause node"),
        dcc.Checklist(id=ids.FOLLOW, options=[{"label": " follow live", "value": "follow"}], value=["follow"],
                      className="gs-follow"),
        html.Label(["colour", dcc.Dropdown(id=ids.COLOR_BY, clearable=False, value="norm",
                                           options=(st.get("compiled") or {}).get("colours", compiled.COLOUR_OPTIONS))],
                   className="gs-field gs-color"),
        html.Label(["find", dcc.Dropdown(id=ids.SEARCH, placeholder="node, module…",
                                         searchable=True, options=st.get("search", []))],
                   className="gs-field gs-search"),
    ])


def _graph_area(st: dict[str, Any]) -> list[Any]:
    """The graph with its buttons, the legend, a line of counts, and the backward player under them."""
    drawn = cyto.Cytoscape(id=ids.GRAPH, elements=st.get("elements", []),
                           layout={"name": "preset", "fit": False},  # first view: assets/graph.js
                           stylesheet=STYLESHEET, autoRefreshLayout=False, minZoom=0.05, maxZoom=3,
                           boxSelectionEnabled=False, className="gs-graph",
                           style={"width": "100%", "height": "100%"})
    # what the step says of torch.compile (app/ui/compiled.py): over the graph's top left corner, where it
    # moves nothing (in the header, a note wrapped the header a row down); empty for most steps
    notes = html.Div(id=ids.STEP_NOTES, className="gs-step-notes", children=(st.get("compiled") or {}).get("notes"))
    return [html.Div(className="gs-graph-wrap", children=[drawn, notes, html.Div(className="gs-graph-tools", children=[
                html.Button("fit", id=ids.GRAPH_FIT, title="show the whole graph", className="gs-btn"),
                html.Button("zoom to selection", id=ids.GRAPH_ZOOM_SELECTION, className="gs-btn",
                            title="zoom to the selected node (or the player's current one)"),
                # its words and what it does: assets/room.js (which remembers the choice)
                html.Button("hide inspector", id=ids.INSPECTOR_TOGGLE, className="gs-btn")]),
                # the overview of a graph bigger than its panel: drawn and driven by assets/minimap.js
                html.Canvas(id=ids.MINIMAP, className="gs-minimap", width=180, height=120,
                            title="the whole graph: the box is what the panel shows; click or drag to go there")]),
            # the legend's fixed part outside the callbacks' output: plotly's encoder takes a second pass
            # over any answer whose text holds "NaN" (docs/web-stack.md)
            html.Div(className="gs-legend", children=[
                html.Div(id=ids.LEGEND, className="gs-legend-scale", children=st.get("legend")),
                html.Span("red border: NaN/Inf", className="gs-nan")]),
            html.Div(id=ids.GRAPH_INFO, className="gs-graph-info", children=st.get("info")),
            _player(st)]


def _player(st: dict[str, Any]) -> Any:
    return html.Div(id=ids.PLAYER, className="gs-player", children=[
        # icons drawn by assets/icons.css (no symbol characters: not every browser has a font for them)
        # (with no text, a button's title is its accessible name)
        html.Button(id=ids.PREV, title="step back (←)", className="gs-btn gs-icon gs-icon-prev"),
        html.Button(id=ids.PLAY, title=player.PLAY_TITLE, className=player.PLAY_CLASS, n_clicks=0),
        html.Button(id=ids.NEXT, title="step forward (→)", className="gs-btn gs-icon gs-icon-next"),
        html.Div(dcc.Slider(id=ids.SLIDER, min=0, max=st.get("slider_max", 0), step=1,
                            value=st.get("slider_value", 0), marks=None,
                            tooltip={"placement": "top", "always_visible": False}, updatemode="drag"),
                 className="gs-slider"),
        dcc.Dropdown(id=ids.SPEED, clearable=False, value=400, className="gs-speed", options=[
            {"label": "slow", "value": 1000}, {"label": "normal", "value": 400}, {"label": "fast", "value": 100}]),
        html.Div(id=ids.PLAYER_INFO, className="gs-player-info", children=st.get("player", "")),
        dcc.Interval(id=ids.TICKER, interval=400, disabled=True),
    ])


def _inspector(st: dict[str, Any]) -> list[Any]:
    """The sample select of a 4-D gradient, and the inspector."""
    # the inspector opens on the player's node (`initial_state`), or with a hint on an empty store
    shown = st.get("inspector")
    # no value until there are options: a value missing from them is reset (to None) by the
    # dropdown itself as it mounts, and that would fire the inspector's callback on load
    return [dcc.Dropdown(id=ids.SAMPLE, value=None, clearable=False, options=shown.sample_options if shown else [],
                         style=shown.sample_style if shown else inspector.HIDDEN, placeholder="sample"),
            inspector.panel(shown)]


def opening(data: PageData) -> tuple[Any, str | None, list[int], int, Any, int | None]:
    """What the page opens with: the run options and the newest run, its ranks and the rank shown, the step
    options and the newest step. The newest step's graph is read first: the lists' labels (`StepFlags`)
    then read its trigger and problems from it, not from a second read of the step."""
    newest = data.runs()
    if newest:
        name = newest[-1]["run"]
        first = compare.rank_field(data.ranks(name))[1]
        steps = data.steps(name, first)
        if steps:
            data.graph(name, steps[-1], first)
    run_options, run = runs.run_choices(data, None, None)
    ranks = data.ranks(run) if run else []
    rank = compare.rank_field(ranks)[1]
    step_options, step = runs.step_choices(data, run, None, None, rank=rank)
    return run_options, run, ranks, rank, step_options, step


def warm(data: PageData) -> None:
    """Decode, fold and colour the step the page opens with, into `data`'s caches, while the browser loads
    the page's scripts (started by the page's address: `GradscapeDash.index`); the page's first request,
    `/_dash-layout`, then finds them made, or waits for them being made (`PageData` makes each once). A
    step that cannot be read is the page's to report: nothing is raised here."""
    try:
        _, run, _, rank, _, step = opening(data)
        if run is None or step is None:
            return
        data.graph(run, step, rank)
        data.layout(run, step, None, rank)
        data.marks(run, step, "norm", rank)
        data.order(run, step, rank)
    except Exception:  # the same reads, made again by the page's request, show the error there
        logging.getLogger(__name__).debug("warming the opening step failed", exc_info=True)


def initial_state(data: PageData) -> dict[str, Any]:
    """The page as first served: the newest run and step already drawn (of the run's first rank, which
    the rank select shows), so the first paint needs no callback round trip (a deep link then moves it,
    in the browser)."""
    run_options, run, ranks, rank, step_options, step = opening(data)
    elements, order, last, value, legend, info, _ = graph.graph_payload(data, run, step, "norm", None,
                                                                        with_search=False, rank=rank)
    player = (f"#{value} of {len(order['nodes'])}: {view.order_name(order, value)} "
              f"({node_element(order['nodes'][value])})" if order and order["nodes"] else "")
    # the inspector opens on the player's node, so the two agree from the first paint
    selected = ({"run": run, "rank": rank, "step": step, "node": order["nodes"][value]}
                if order and order["nodes"] else None)
    panel = inspector.inspector_payload(data, selected) if selected else None
    return {"run_options": run_options, "run": run, "step_options": step_options, "step": step,
            "elements": elements, "order": order, "slider_max": last, "slider_value": value, "legend": legend,
            "info": info, "player": player, "selected": selected, "inspector": panel,
            "problems": problems.lines_of(data, run, step, rank), "ranks": ranks,
            "compiled": compiled.payload(data, run, step, rank)}
