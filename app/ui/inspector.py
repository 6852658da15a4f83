"""The inspector (`#inspector`): the selected node's Node tab (what arrived at it, grad_outputs, and what
it sent on, grad_inputs, each slot a heatmap with its label and statistics), its module's tab
(grad_input / grad_output per call, parameter gradients) and the gradient flow tab. The figures come
from `app.view`; this module lays them out.

The tabs themselves are laid out once (`panel`): a new node or a streamed step replaces what is under
them (each tab's body, the module tab's label), never the tab strip, so a tab stays where the person's
pointer is while steps arrive, and the one they chose stays chosen."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, NamedTuple

import dash
from dash import ClientsideFunction, Input, Output, dcc, html

from gradscape.app import view
from gradscape.app.data import PageData
from gradscape.app.ui import ids
from gradscape.app.view.ids import node_element
from gradscape.tracer.store import StoreError
from gradscape.tracer.wire import TensorArrays, WireStep

HINT = "Click a node of the graph (or step through the backward pass) to see what arrived at it and what it sent on."
HIDDEN = {"display": "none"}


class InspectorView(NamedTuple):
    """What the inspector shows, one field for each property the inspector's callback sets (`OUTPUTS`)."""
    note: Any  # the hint, or why the node cannot be shown; None under a node's tabs
    tabs_style: dict[str, Any]
    node: Any  # the Node tab's body
    module_label: str
    module_style: dict[str, Any]  # the module tab hides for a node outside every module
    module: Any  # the module tab's body
    flow: Any  # the gradient flow tab's body
    sample_options: list[dict[str, Any]]
    sample_style: dict[str, Any]


OUTPUTS = [Output(ids.INSPECTOR_NOTE, "children"), Output(ids.TABS, "style"), Output(ids.NODE_TAB, "children"),
           Output(ids.MODULE_TAB, "label"), Output(ids.MODULE_TAB, "style"), Output(ids.MODULE_TAB_BODY, "children"),
           Output(ids.FLOW_TAB, "children"), Output(ids.SAMPLE, "options"), Output(ids.SAMPLE, "style")]


def note_view(text: str) -> InspectorView:
    """The inspector with a line of text and no tabs: the hint, or why a node cannot be shown."""
    return InspectorView(html.P(text, className="gs-hint"), HIDDEN, None, "Module", HIDDEN, None, None, [], HIDDEN)


def panel(shown: InspectorView | None) -> Any:
    """The inspector's box as the page lays it out, opening on `shown` (the hint without one)."""
    v = shown or note_view(HINT)
    tabs = [dcc.Tab(label="Node", value="node", children=html.Div(id=ids.NODE_TAB, children=v.node)),
            dcc.Tab(id=ids.MODULE_TAB, label=v.module_label, value="module", style=v.module_style,
                    children=html.Div(id=ids.MODULE_TAB_BODY, children=v.module)),
            dcc.Tab(label="Gradient flow", value="flow", children=html.Div(id=ids.FLOW_TAB, children=v.flow))]
    return html.Div(id=ids.INSPECTOR, className="gs-inspector", children=[
        html.Div(id=ids.INSPECTOR_NOTE, children=v.note),
        dcc.Tabs(id=ids.TABS, value="node", children=tabs, style=v.tabs_style)])


def register(app: dash.Dash, data: PageData) -> None:
    # The selection reaches the inspector through a gate in the browser (`inspectGate`, assets/inspector.js):
    # one render at a time, then the newest selection. Straight from the selection, a run streaming a step
    # every 0.4 s changed it (the same node, a new step) faster than a render took, and Dash drops the
    # answer of a callback whose input changes while it is in flight: the inspector stayed on an old node.
    # Each render also numbers the inspector (`data-rendered`): the gate sees that change in the page and
    # sends the selection that waited (an input here would close a loop of callbacks, which Dash refuses).
    app.clientside_callback(ClientsideFunction("gradscape", "inspectGate"), Output(ids.INSPECTED, "data"),
                            Input(ids.SELECTED, "data"), prevent_initial_call=True)
    renders = itertools.count(1)

    @app.callback(*OUTPUTS, Output(ids.INSPECTOR, "data-rendered"),
                  Input(ids.INSPECTED, "data"), Input(ids.SAMPLE, "value"), prevent_initial_call=True)
    def inspect(selected: dict[str, Any] | None, sample: int | None) -> Any:
        shown = inspector_payload(data, selected, sample) if selected else note_view(HINT)  # cleared (Esc): the hint
        return *shown, next(renders)


def inspector_payload(data: PageData, selected: dict[str, Any], sample: int | None = None) -> InspectorView:
    """The inspector for one selected node (of its `rank`, 0 when it names none): its tabs' bodies, and the
    sample choices (hidden without a 4-D tensor)."""
    run, step, node = selected["run"], selected["step"], selected["node"]
    rank = int(selected.get("rank") or 0)
    try:
        wire = data.graph(run, step, rank)
    except StoreError as exc:
        return note_view(str(exc))
    if not 0 <= node < len(wire["nodes"]):
        return note_view(f"no node {node} in step {step}")
    module = wire["nodes"][node]["module"]
    has_module = bool(module and module in wire["modules"])
    wanted = set(view.node_tensors(wire, node))
    if has_module:
        wanted |= set(view.module_tensors(wire, module))  # the module tab's heatmaps
    arrays = data.arrays(run, step, sorted(wanted), rank)
    slots = view.slot_figures(wire, node, arrays, sample=int(sample or 0))
    both = slots["grad_outputs"]["slots"] + slots["grad_inputs"]["slots"]
    full_4d = [s for s in both if len(s.get("shape") or []) == 4 and "full" in str(s.get("source"))]
    options = [{"label": f"sample {k}", "value": k} for k in range(min(full_4d[0]["shape"][0], 256))] \
        if full_4d else []
    return InspectorView(
        None, {}, _node_tab(wire, node, slots),
        f"Module {module}" if has_module else "Module", {} if has_module else HIDDEN,
        _module_tab(wire, module, arrays) if has_module
        else html.P(f"{node_element(node)} ran outside every module's forward: no module to show.",
                    className="gs-hint"),
        _flow_tab(wire, data.flow_over_steps(run, step, rank)), options, {"width": "160px"} if full_4d else HIDDEN)


def _stats_table(rows: list[dict[str, Any]]) -> Any:
    if not rows:
        return None
    return html.Table(className="gs-stats", children=[
        html.Tr([html.Th(r["stat"]) for r in rows]), html.Tr([html.Td(r["text"]) for r in rows])])


def slot_view(slot: dict[str, Any], kind: str, index: int, call: int | None = None, id_type: str = "slot") -> Any:
    """One gradient slot (from `view.slot_figures` / `view.slot_of`) as the page shows it: its label,
    view and source, the heatmap, the statistics table. `id_type`: the `type` of its pattern id (the
    breakpoint panel shows slots too, beside the inspector's, under ids of its own)."""
    fig = slot.get("figure")
    body: list[Any] = [html.Div(f"{kind}[{index}] · {slot.get('title', '')}", className="gs-slot-title")]
    if slot.get("source"):
        body.append(html.Div(f"{slot.get('view', '')} · {slot['source']}", className="gs-slot-note"))
    if slot.get("note"):
        body.append(html.Div(slot["note"], className="gs-slot-note"))
    if fig is not None:
        # titled once: the slot's own title line above says what the figure's title would
        fig = {**fig, "layout": {**fig["layout"], "title": {"text": ""},
                                 "margin": {**fig["layout"].get("margin", {}), "t": 8}}}
        fig["layout"]["height"] = max(120, fig["layout"].get("height", 320) - 36)
        # the graph's box as tall as the figure: a shorter box let the plot draw over the next heading
        body.append(dcc.Graph(figure=fig, config={"displayModeBar": False, "responsive": True},
                              className="gs-heatmap", style={"height": f"{fig['layout'].get('height', 320)}px"}))
    if slot.get("key"):  # NaN/Inf cells: colours outside the map's scale, named
        body.append(html.Div(["cells outside the scale: "] + [
            html.Span([html.Span(className="gs-swatch", style={"background": k["colour"]}), k["name"]],
                      className="gs-key-item") for k in slot["key"]], className="gs-nan-key"))
    body.append(_stats_table(slot.get("stats") or []))
    key = {"type": id_type, "kind": kind, "index": index, **({"call": call} if call is not None else {})}
    return html.Div(body, className="gs-slot", id=key)



def _node_tab(wire: WireStep, node_id: int, slots: dict[str, Any]) -> list[Any]:
    n = wire["nodes"][node_id]
    shapes_in = ", ".join("×".join(map(str, s)) if s else "—" for s in n["in_shapes"]) or "—"
    shapes_out = ", ".join("×".join(map(str, s)) if s else "—" for s in n["out_shapes"]) or "—"
    meta = html.Div(className="gs-meta", children=[
        html.Div([html.B(n["name"]), f"  (node {node_element(node_id)}, {n['kind']})",
                  f", ran #{n['order']}" if n["order"] is not None else ", did not run in this backward",
                  # which process's trace this is (torch.distributed only: the ranks' gradients differ)
                  f" · rank {wire['rank']} of {wire['world_size']}" if wire["rank"] is not None else ""]),
        html.Div(["schema: ", html.Code(n["schema"] or "—")]),
        html.Div(f"module: {n['module'] or '—'} · source: {n['source'] or '—'}"
                 + (f" · parameter: {n['param']}" if n["param"] else "")),
        html.Div(f"forward inputs: {shapes_in} → forward outputs: {shapes_out}"),
    ])
    slots_out = [slot_view(s, "grad_outputs", i) for i, s in enumerate(slots["grad_outputs"]["slots"])]
    slots_in = [slot_view(s, "grad_inputs", j) for j, s in enumerate(slots["grad_inputs"]["slots"])]
    return [meta, html.Div(slots["explain"], className="gs-explain"),
            html.H3(slots["grad_outputs"]["title"]), *slots_out,
            html.H3(slots["grad_inputs"]["title"]), *slots_in]


def _flow_tab(wire: WireStep, flow_steps: dict[str, Any]) -> list[Any]:
    flow = view.gradient_flow(wire)
    return [dcc.Graph(id=ids.FLOW, figure=flow, config={"displayModeBar": False},
                      style={"height": f"{flow['layout']['height']}px"}),
            dcc.Graph(id=ids.FLOW_STEPS, figure=flow_steps, config={"displayModeBar": False},
                      style={"height": "320px"})]


def _module_tab(wire: WireStep, module: str, arrays: Mapping[int, TensorArrays] | None = None) -> list[Any]:
    d = view.module_detail(wire, module, arrays)
    out: list[Any] = [html.Div(f"{module} ({d.get('type')})", className="gs-meta"),
                      html.Div(d["backward_hook"]["text"], className="gs-explain")]
    for call in d["calls"]:
        out.append(html.H3(f"call {call['call']}: grad_output (∂L/∂ output)"))
        out.extend(slot_view(s, "grad_output", k, call["call"])
                   for k, s in enumerate(call["slots"]["grad_output"]))
        out.append(html.H3(f"call {call['call']}: grad_input (∂L/∂ input, through this module only)"))
        out.extend(slot_view(s, "grad_input", k, call["call"])
                   for k, s in enumerate(call["slots"]["grad_input"]))
    if d["params"]:
        out.append(html.H3("parameter gradients"))
        table = d["param_table"]
        out.append(html.Table(className="gs-table gs-params", children=[
            html.Tr([html.Th(c) for c in table["columns"]]),
            *[html.Tr([html.Td(v) for v in row]) for row in table["rows"]]]))
    return out
