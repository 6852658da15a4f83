"""The inspector (`#inspector`): the selected node's Node tab (what arrived at it, grad_outputs, and what
it sent on, grad_inputs, each slot a heatmap with its label and statistics), its module's tab
(grad_input / grad_output per call, parameter gradients) and the gradient flow tab. The figures come
from `app.view`; this module lays them out."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import dash
from dash import ClientsideFunction, Input, Output, dcc, html

from gradscape.app import view
from gradscape.app.data import PageData
from gradscape.app.ui import ids
from gradscape.app.view.ids import node_element
from gradscape.tracer.store import StoreError
from gradscape.tracer.wire import TensorArrays, WireStep

HINT = "Click a node of the graph (or step through the backward pass) to see what arrived at it and what it sent on."


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

    @app.callback(Output(ids.INSPECTOR, "children"), Output(ids.SAMPLE, "options"), Output(ids.SAMPLE, "style"),
                  Output(ids.INSPECTOR, "data-rendered"),
                  Input(ids.INSPECTED, "data"), Input(ids.SAMPLE, "value"), prevent_initial_call=True)
    def inspect(selected: dict[str, Any] | None, sample: int | None) -> Any:
        if not selected:  # cleared (Esc): the hint again
            return [html.P(HINT, className="gs-hint")], [], {"display": "none"}, next(renders)
        return *inspector_payload(data, selected, sample), next(renders)


def inspector_payload(data: PageData, selected: dict[str, Any], sample: int | None = None) -> tuple[Any, Any, Any]:
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
    module = wire["nodes"][node]["module"]
    wanted = set(view.node_tensors(wire, node))
    if module and module in wire["modules"]:
        wanted |= set(view.module_tensors(wire, module))  # the module tab's heatmaps
    arrays = data.arrays(run, step, sorted(wanted), rank)
    panel = view.slot_figures(wire, node, arrays, sample=int(sample or 0))
    slots = panel["grad_outputs"]["slots"] + panel["grad_inputs"]["slots"]
    full_4d = [s for s in slots if len(s.get("shape") or []) == 4 and "full" in str(s.get("source"))]
    options = [{"label": f"sample {k}", "value": k} for k in range(min(full_4d[0]["shape"][0], 256))] \
        if full_4d else []
    return (_inspector(wire, node, panel, data.flow_over_steps(run, step, rank), arrays), options,
            {"width": "160px"} if full_4d else hidden)


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


def _inspector(wire: WireStep, node_id: int, panel: dict[str, Any], flow_steps: dict[str, Any],
               arrays: Mapping[int, TensorArrays] | None = None) -> Any:
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
    slots_out = [slot_view(s, "grad_outputs", i) for i, s in enumerate(panel["grad_outputs"]["slots"])]
    slots_in = [slot_view(s, "grad_inputs", j) for j, s in enumerate(panel["grad_inputs"]["slots"])]
    node_tab = [meta, html.Div(panel["explain"], className="gs-explain"),
                html.H3(panel["grad_outputs"]["title"]), *slots_out,
                html.H3(panel["grad_inputs"]["title"]), *slots_in]
    tabs = [dcc.Tab(label="Node", value="node", children=node_tab)]
    module = n["module"]
    if module and module in wire["modules"]:
        tabs.append(dcc.Tab(label=f"Module {module}", value="module", children=_module_tab(wire, module, arrays)))
    flow = view.gradient_flow(wire)
    tabs.append(dcc.Tab(label="Gradient flow", value="flow", children=[
        dcc.Graph(id=ids.FLOW, figure=flow, config={"displayModeBar": False},
                  style={"height": f"{flow['layout']['height']}px"}),
        dcc.Graph(id=ids.FLOW_STEPS, figure=flow_steps, config={"displayModeBar": False},
                  style={"height": "320px"})]))
    # the tab the person picked survives a new render (a streamed step re-renders the inspector): Dash's
    # persistence re-applies their choice while the value rendered here stays "node"
    return dcc.Tabs(id=ids.TABS, value="node", children=tabs, persistence=True, persistence_type="memory")


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
