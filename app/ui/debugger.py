"""The page's breakpoint panel: a break control (on the selected node, its module, a non-finite
gradient or a norm above a threshold), a banner while the run is paused with `bp-step` and
`bp-continue`, the partial backward (the nodes run so far with their gradients' statistics, lit on
the graph), and the heatmaps of one of them (the paused node, or the row last clicked).

All but the heatmaps runs in the browser (assets/debugger.js): a `paused` or `breakpoints`
notification on `/ui` only says which run changed, and the page reads the state from the JSON API
(app/api/debugger.py), so notifications that merge lose nothing. Writes go to the same API with the page's
own origin. The heatmaps are drawn on the server, as the inspector draws a finished step's
(`view.slot_figures`, `inspector.slot_view`), from the thumbnails the tracer sent with the pause
(NOTE [Paused heatmaps] in tracer/record/debug/breakpoints.py), read through `PageData.paused_node` and made a
one-node step by `protocol.paused_step`. Their one input is `ids.BP_PICK`, which the
browser sets (a click on a row; a new pause picks its paused node) and nothing streamed changes:
Dash drops the answer of a callback whose input changes while it is in flight.
"""

from __future__ import annotations

from typing import Any

from dash import ClientsideFunction, Dash, Input, Output, State, dcc, html

from gradscape.app import view
from gradscape.app.data import PageData
from gradscape.app.ui import ids
from gradscape.app.ui.inspector import slot_view
from gradscape.app.view.heatmaps import ARRIVING, SENT
from gradscape.tracer import protocol

OVER_BUDGET = ("heatmap not sent: a paused tracer sends the thumbnails of the newest nodes only, up to its "
               "budget for one pause (statistics only)")

KINDS = [{"label": "this node (by name)", "value": "node-name"},
         {"label": "this node (by id)", "value": "node-id"},
         {"label": "this node's module", "value": "module"},
         {"label": "a non-finite gradient", "value": "nonfinite"},
         {"label": "a gradient norm above", "value": "norm"}]


def panel() -> Any:
    """The panel (its notifications come on the page's own `/ui` socket)."""
    return html.Div(className="gs-bp", children=[
        dcc.Store(id=ids.BP_STATE), dcc.Store(id=ids.BP_SENT), dcc.Store(id=ids.BP_PICK),
        html.Div(className="gs-bp-controls", children=[
            html.Span("break on", className="gs-bp-label"),
            dcc.Dropdown(id=ids.BP_KIND, options=KINDS, value="node-name", clearable=False, className="gs-bp-kind"),
            dcc.Input(id=ids.BP_ABOVE, type="number", value=1000, debounce=False, className="gs-bp-above",
                      placeholder="norm", style={"display": "none"}),  # shown for a norm breakpoint only
            html.Button("break", id=ids.BP_SET, className="gs-btn", n_clicks=0),
            html.Button("clear", id=ids.BP_CLEAR, className="gs-btn", n_clicks=0),
        ]),
        html.Div(id=ids.BP_LIST, className="gs-bp-list"),
        html.Div(id=ids.BP_BANNER, className="gs-bp-banner", style={"display": "none"}, children=[
            html.Div(id=ids.BP_WHERE, className="gs-bp-where"),
            html.Button("step", id=ids.BP_STEP, className="gs-btn", n_clicks=0, title="run one more node"),
            html.Button("continue", id=ids.BP_CONTINUE, className="gs-btn", n_clicks=0,
                        title="run to the next breakpoint"),
            html.Div(id=ids.BP_NODES, className="gs-bp-nodes", title="click a row to see its gradients"),
            html.Div(id=ids.BP_HEATMAPS, className="gs-bp-heatmaps"),
        ]),
    ])


def heatmaps(data: PageData, pick: dict[str, Any] | None) -> Any:
    """The heatmaps of the picked paused node: what arrived at it and what it sent on, each slot
    labelled as the inspector labels it, with shape and statistics."""
    if not pick or not isinstance(pick.get("run"), str) or not isinstance(pick.get("node"), int):
        return []
    order = pick.get("order") if isinstance(pick.get("order"), int) else None
    where, doc = data.paused_node(pick["run"], pick["node"], order)
    if where is None:
        return html.P(f"run {pick['run']!r} is not paused", className="gs-hint")
    if doc is None:
        return html.P(f"node {pick['node']} has not run in this backward", className="gs-hint")
    wire, arrays = protocol.paused_step(doc)
    panel = view.slot_figures(wire, 0, arrays)
    for kind in protocol.SLOTS:
        for slot in panel[kind]["slots"]:
            if not doc["thumbs"] and slot["shape"] is not None and slot["figure"] is None:
                slot["note"] = OVER_BUDGET
    owner = doc.get("module") or doc.get("param")
    runs = f", its run {doc['runs']} in this step" if doc["runs"] > 1 else ""
    head = html.Div(className="gs-meta", children=[
        html.B(f"{doc['name']} #{doc['id']}"), f" ({owner})" if owner else "",
        f" · ran #{doc['order']} of {where['executed']} so far{runs}",
        " · the paused node" if doc["order"] == where["executed"] - 1 else "",
        f" · {doc['source']}" if doc.get("source") else ""])
    sent: list[Any] = [slot_view(s, "grad_inputs", j, id_type="bp-slot")
                       for j, s in enumerate(panel["grad_inputs"]["slots"])]
    if doc["grad_inputs"] is None:
        sent = [html.P("nothing: it adds what arrived to the tensor's .grad", className="gs-hint")]
    marks: dict[str, Any] = {"data-node": str(doc["id"]), "data-order": str(doc["order"])}  # for tests and scripts
    return html.Div(className="gs-bp-node", **marks,
                    children=[head, html.Div(panel["explain"], className="gs-explain"), html.H3(ARRIVING),
                              *[slot_view(s, "grad_outputs", i, id_type="bp-slot")
                                for i, s in enumerate(panel["grad_outputs"]["slots"])],
                              html.H3(SENT), *sent])


def register(app: Dash, data: PageData) -> None:
    @app.callback(Output(ids.BP_HEATMAPS, "children"), Input(ids.BP_PICK, "data"), prevent_initial_call=True)
    def paused_heatmaps(pick: dict[str, Any] | None) -> Any:
        return heatmaps(data, pick)

    fn = "gradscapeDebug"
    # a notification for the shown run (or the catch-up on connecting that names it, or another run
    # chosen) → read the run's state; nothing is read on load when no run has any
    app.clientside_callback(ClientsideFunction(fn, "refresh"), Output(ids.BP_STATE, "data"),
                            Input(ids.SOCKET, "data-paused"), Input(ids.SOCKET, "data-breakpoints"),
                            Input(ids.RUN_SELECT, "value"), State(ids.GRAPH, "stylesheet"),
                            prevent_initial_call=True)
    app.clientside_callback(ClientsideFunction(fn, "thresholdShown"), Output(ids.BP_ABOVE, "style"),
                            Input(ids.BP_KIND, "value"))
    app.clientside_callback(ClientsideFunction(fn, "write"), Output(ids.BP_SENT, "data"),
                            Input(ids.BP_SET, "n_clicks"), Input(ids.BP_CLEAR, "n_clicks"),
                            Input(ids.BP_STEP, "n_clicks"), Input(ids.BP_CONTINUE, "n_clicks"),
                            State(ids.BP_KIND, "value"), State(ids.BP_ABOVE, "value"), State(ids.SELECTED, "data"),
                            State(ids.RUN_SELECT, "value"), State(ids.STEP_SELECT, "value"),
                            prevent_initial_call=True)
