"""The page's breakpoint panel: a break control (on the selected node, its module, a non-finite
gradient or a norm above a threshold), a banner while the run is paused with `bp-step` and
`bp-continue`, and the partial backward (the nodes run so far with their gradients' statistics,
lit on the graph).

Everything here runs in the browser (assets/debugger.js): a `paused` or `breakpoints` notification
on `/ui` only says which run changed, and the page reads the state from the JSON API (app/debug.py),
so notifications that merge lose nothing. Writes go to the same API with the page's own origin.
"""

from __future__ import annotations

from typing import Any

from dash import ClientsideFunction, Dash, Input, Output, State, dcc, html

from app.ui import ids

KINDS = [{"label": "this node (by name)", "value": "node-name"},
         {"label": "this node (by id)", "value": "node-id"},
         {"label": "this node's module", "value": "module"},
         {"label": "a non-finite gradient", "value": "nonfinite"},
         {"label": "a gradient norm above", "value": "norm"}]


def panel() -> Any:
    """The panel (its notifications come on the page's own `/ui` socket)."""
    return html.Div(className="gs-bp", children=[
        dcc.Store(id=ids.BP_STATE), dcc.Store(id=ids.BP_SENT),
        html.Div(className="gs-bp-controls", children=[
            html.Span("break on", className="gs-bp-label"),
            dcc.Dropdown(id=ids.BP_KIND, options=KINDS, value="node-name", clearable=False, className="gs-bp-kind"),
            dcc.Input(id=ids.BP_ABOVE, type="number", value=1000, debounce=False, className="gs-bp-above",
                      placeholder="norm"),
            html.Button("break", id=ids.BP_SET, className="gs-btn", n_clicks=0),
            html.Button("clear", id=ids.BP_CLEAR, className="gs-btn", n_clicks=0),
        ]),
        html.Div(id=ids.BP_LIST, className="gs-bp-list"),
        html.Div(id=ids.BP_BANNER, className="gs-bp-banner", style={"display": "none"}, children=[
            html.Div(id=ids.BP_WHERE, className="gs-bp-where"),
            html.Button("step", id=ids.BP_STEP, className="gs-btn", n_clicks=0, title="run one more node"),
            html.Button("continue", id=ids.BP_CONTINUE, className="gs-btn", n_clicks=0,
                        title="run to the next breakpoint"),
            html.Div(id=ids.BP_NODES, className="gs-bp-nodes"),
        ]),
    ])


def register(app: Dash) -> None:
    fn = "gradscapeDebug"
    # a notification for the shown run (or the catch-up on connecting that names it, or another run
    # chosen) → read the run's state; nothing is read on load when no run has any
    app.clientside_callback(ClientsideFunction(fn, "refresh"), Output(ids.BP_STATE, "data"),
                            Input(ids.SOCKET, "data-paused"), Input(ids.SOCKET, "data-breakpoints"),
                            Input(ids.RUN_SELECT, "value"), State(ids.GRAPH, "stylesheet"),
                            prevent_initial_call=True)
    app.clientside_callback(ClientsideFunction(fn, "write"), Output(ids.BP_SENT, "data"),
                            Input(ids.BP_SET, "n_clicks"), Input(ids.BP_CLEAR, "n_clicks"),
                            Input(ids.BP_STEP, "n_clicks"), Input(ids.BP_CONTINUE, "n_clicks"),
                            State(ids.BP_KIND, "value"), State(ids.BP_ABOVE, "value"), State(ids.SELECTED, "data"),
                            State(ids.RUN_SELECT, "value"), State(ids.STEP_SELECT, "value"),
                            prevent_initial_call=True)
