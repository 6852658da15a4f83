"""The rank selector and the compare view (torch.distributed): the selected node or parameter on two
ranks of one step, or on two steps of one rank, as a difference heatmap (`app.view.compare`).

`#rank-select` is the rank the whole page shows: the step list holds that rank's steps, and the graph,
the player, the inspector (its gradient flow over steps included), the problems panel, the search and
"follow live" read that rank; the compare view reads it as side A. A selection on a rank other than 0
writes `rank=` into the address (app/ui/address.py). The select is disabled and hidden while the run
has one rank (always, outside torch.distributed).

The rank follows the run and deep links here (`sync_ranks`); the step list follows the rank
(`runs.sync_steps`). A rank that starts storing steps after the page loaded is added to the select
in the browser, from the step list's read (`liveSteps` in assets/live.js).
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, ctx, dcc, html, no_update

from gradscape.app.data import PageData
from gradscape.app.ui import ids
from gradscape.app.ui.address import link_rank
from gradscape.app.view import compare as cmp
from gradscape.tracer.store import StoreError

HIDDEN = {"display": "none"}


def rank_field(ranks: list[int] | None) -> tuple[list[dict[str, Any]], int, bool, dict[str, str]]:
    """The rank select's options, value, disabled flag and its field's style for a run's ranks."""
    ranks = ranks or []
    options = [{"label": f"rank {r}", "value": r} for r in ranks] or [{"label": "rank 0", "value": 0}]
    one = len(ranks) <= 1
    return options, ranks[0] if ranks else 0, one, HIDDEN if one else {}


def rank_choice(ranks: list[int], run: str | None, link: dict[str, Any] | None, current: int | None) -> int:
    """The rank to show of a run with `ranks`: a deep link's when it names this run (a link without
    `rank=` names rank 0), else the current one, else the run's first; always one the run has (0 when it
    has none). `link`: only when the address has just changed."""
    if link and link.get("run") == run and link_rank(link) in ranks:
        return link_rank(link)
    if current is not None and current in ranks:
        return current
    return ranks[0] if ranks else 0


def panel(ranks: list[int] | None = None) -> Any:
    """The rank field (for the run shown first, with `ranks`), the button opening the compare view, and
    the view (hidden until opened)."""
    options, value, one, style = rank_field(ranks)
    return html.Div(className="gs-compare", children=[
        html.Div(className="gs-compare-bar", children=[
            html.Label(["on", dcc.Dropdown(id=ids.RANK_SELECT, clearable=False, value=value, disabled=one,
                                           options=options, className="gs-rank")],
                       id=ids.RANK_FIELD, className="gs-field gs-rank-field", style=style),
            html.Button("compare…", id=ids.COMPARE_OPEN, n_clicks=0, className="gs-btn",
                        title="the selected node or parameter on two ranks or two steps"),
        ]),
        html.Div(id=ids.COMPARE, className="gs-compare-view", style=HIDDEN, children=[
            dcc.RadioItems(id=ids.COMPARE_AGAINST, value="rank", inline=True, options=[
                {"label": " another rank", "value": "rank"}, {"label": " another step", "value": "step"}]),
            html.Label(["against", dcc.Dropdown(id=ids.COMPARE_OTHER, clearable=False, options=[], value=None,
                                                placeholder="—")], className="gs-field"),
            html.Label(["what", dcc.Dropdown(id=ids.COMPARE_TARGET, clearable=False, options=[], value=None,
                                             placeholder="a parameter, or click a node")], className="gs-field"),
            html.Div(id=ids.COMPARE_RESULT),
        ]),
    ])


def register(app: dash.Dash, data: PageData) -> None:
    _register_ranks(app, data)

    @app.callback(Output(ids.COMPARE, "style"), Input(ids.COMPARE_OPEN, "n_clicks"), prevent_initial_call=True)
    def toggle(n: int | None) -> Any:
        return {} if (n or 0) % 2 else HIDDEN

    @app.callback(Output(ids.COMPARE_OTHER, "options"), Output(ids.COMPARE_OTHER, "value"),
                  Input(ids.RUN_SELECT, "value"), Input(ids.STEP_SELECT, "value"), Input(ids.RANK_SELECT, "value"),
                  Input(ids.COMPARE_AGAINST, "value"), Input(ids.COMPARE_OPEN, "n_clicks"),
                  State(ids.COMPARE_OTHER, "value"), prevent_initial_call=True)
    def other_choices(run: str | None, step: int | None, rank: int | None, against: str, _open: Any,
                      current: Any) -> Any:
        return _other_choices(data, run, step, int(rank or 0), against, current,
                              keep=ctx.triggered_id != ids.COMPARE_AGAINST)

    @app.callback(Output(ids.COMPARE_TARGET, "options"), Output(ids.COMPARE_TARGET, "value"),
                  Input(ids.RUN_SELECT, "value"), Input(ids.STEP_SELECT, "value"), Input(ids.RANK_SELECT, "value"),
                  Input(ids.SELECTED, "data"), Input(ids.COMPARE_OPEN, "n_clicks"), State(ids.COMPARE_TARGET, "value"),
                  prevent_initial_call=True)
    def target_choices(run: str | None, step: int | None, rank: int | None, selected: dict[str, Any] | None,
                       _open: Any, current: str | None) -> Any:
        return _target_choices(data, run, step, int(rank or 0), selected, current,
                               chose_node=ctx.triggered_id == ids.SELECTED)

    @app.callback(Output(ids.COMPARE_RESULT, "children"),
                  Input(ids.COMPARE_OPEN, "n_clicks"), Input(ids.COMPARE_OTHER, "value"),
                  Input(ids.COMPARE_TARGET, "value"), State(ids.COMPARE_AGAINST, "value"),
                  State(ids.RUN_SELECT, "value"), State(ids.STEP_SELECT, "value"), State(ids.RANK_SELECT, "value"),
                  prevent_initial_call=True)
    def render(n: int | None, other: Any, target: str | None, against: str, run: str | None, step: int | None,
               rank: int | None) -> Any:
        if not (n or 0) % 2:
            return no_update
        return compare_view(data, run, step, int(rank or 0), other, target, across=against != "step")


def _register_ranks(app: dash.Dash, data: PageData) -> None:
    @app.callback(Output(ids.RANK_SELECT, "options"), Output(ids.RANK_SELECT, "value"),
                  Output(ids.RANK_SELECT, "disabled"), Output(ids.RANK_FIELD, "style"),
                  Input(ids.RUN_SELECT, "value"), Input(ids.DEEP_LINK, "data"), State(ids.RANK_SELECT, "value"),
                  prevent_initial_call=True)  # first load: the layout holds the ranks
    def sync_ranks(run: str | None, link: dict[str, Any] | None, current: int | None) -> Any:
        """Another run, or an address naming a rank. The value changes only when the rank does: every
        view of the page reads the rank, and an unchanged one would redraw them all."""
        ranks = data.ranks(run) if run else []
        options, _, one, style = rank_field(ranks)
        from_link = f"{ids.DEEP_LINK}.data" in ctx.triggered_prop_ids
        rank = rank_choice(ranks, run, link if from_link else None, current)
        return options, rank if rank != current else no_update, one, style


def _other_choices(data: PageData, run: str | None, step: int | None, rank: int, against: str, current: Any,
                   keep: bool) -> tuple[list[dict[str, Any]], Any]:
    """What side B can be: the other steps of the rank (the one before by default) or the other ranks of
    the step; the current choice stays when `keep` and it is still there."""
    if not run or step is None:
        return [], None
    if against == "step":
        steps = [s for s in data.steps(run, rank) if s != step]
        options = [{"label": f"step {s}", "value": s} for s in steps]
        earlier = [s for s in steps if s < step]
        default = earlier[-1] if earlier else (steps[0] if steps else None)
    else:
        others = [r for r in data.ranks(run) if r != rank]
        options = [{"label": f"rank {r}", "value": r} for r in others]
        default = others[0] if others else None
    values = [o["value"] for o in options]
    return options, current if keep and current in values else default


def _target_choices(data: PageData, run: str | None, step: int | None, rank: int, selected: dict[str, Any] | None,
                    current: str | None, chose_node: bool) -> tuple[list[dict[str, str]], str | None]:
    """What can be compared: every parameter, and the selected node (chosen when it was just selected)."""
    if not run or step is None:
        return [], None
    try:
        wire = data.graph(run, step, rank)
    except StoreError:
        return [], None
    options = cmp.targets(wire)
    chosen = None
    if selected and selected.get("run") == run and 0 <= int(selected.get("node", -1)) < len(wire["nodes"]):
        node = cmp.node_target(wire, int(selected["node"]))
        if node["value"] not in [o["value"] for o in options]:
            options.append(node)
        if chose_node:
            chosen = node["value"]
    values = [o["value"] for o in options]
    if chosen is None:
        chosen = current if current in values else (values[0] if values else None)
    return options, chosen


def compare_view(data: PageData, run: str | None, step: int | None, rank: int, other: Any, target: str | None,
                 across: bool) -> Any:
    """The compare view's content: `target` on (rank, step) against the `other` rank (`across`) or step."""
    if not run or step is None or other is None or not target:
        why = ("no other rank or step to compare with" if other is None else "pick what to compare")
        return html.P(why, id=ids.COMPARE_STATUS, className="gs-hint")
    step_b, rank_b = (step, int(other)) if across else (int(other), rank)
    try:
        wire_a = data.graph(run, step, rank)
        wire_b = data.graph(run, step_b, rank_b)
    except StoreError as exc:
        return html.P(str(exc), id=ids.COMPARE_STATUS, className="gs-hint")
    ia, ib = cmp.target_tensor(wire_a, target), cmp.target_tensor(wire_b, target)
    arrays_a = data.arrays(run, step, [] if ia is None else [ia], rank)
    arrays_b = data.arrays(run, step_b, [] if ib is None else [ib], rank_b)
    res = cmp.compare(wire_a, arrays_a, wire_b, arrays_b, target, label_a=f"rank {rank} step {step}",
                      label_b=f"rank {rank_b} step {step_b}", across_ranks=across)
    return result_view(res)


def result_view(res: dict[str, Any]) -> Any:
    if res["error"]:
        return html.P(res["error"], id=ids.COMPARE_STATUS, className="gs-hint")
    if res["desync"]:
        status = html.P("desync: this parameter's gradient differs across ranks after all-reduce "
                        f"(max |A − B| = {res['stats'][0]['text']})", id=ids.COMPARE_STATUS,
                        className="gs-desync", style={"color": "#d00000", "fontWeight": "bold"})
    elif res["max_abs"] == 0:
        status = html.P("no difference: A and B are equal" + (" (thumbnails)" if res["note"] else ""),
                        id=ids.COMPARE_STATUS, className="gs-same")
    else:
        status = html.P(f"they differ: max |A − B| = {res['stats'][0]['text']}", id=ids.COMPARE_STATUS,
                        className="gs-differ")
    rows = res["stats"]
    return html.Div([
        html.H3(res["title"]), status,
        html.P(f"compared on {res['basis']}", className="gs-hint gs-compare-basis"),
        dcc.Graph(figure=res["figure"], config={"displayModeBar": False, "responsive": True},
                  className="gs-heatmap gs-compare-heatmap", style={"height": "230px"}),
        html.Table(className="gs-stats", children=[
            html.Tr([html.Th(r["stat"]) for r in rows]), html.Tr([html.Td(r["text"]) for r in rows])]),
    ])
