"""The problems panel (`#problems`): a count badge and one line per problem of the step shown (of the
rank shown), root cause first; clicking a line that names a node selects it in the graph and the
inspector."""

from __future__ import annotations

from typing import Any

import dash
from dash import ALL, ClientsideFunction, Input, Output, State, html, no_update

from gradscape.app import view
from gradscape.app.data import PageData
from gradscape.app.ui import ids
from gradscape.app.ui.address import address
from gradscape.app.view.ids import node_element
from gradscape.app.view.problems import problem_lines
from gradscape.tracer.store import StoreError

LINE = "problem-line"  # pattern-matching id type of a clickable line


def lines_of(data: PageData, run: str | None, step: int | None, rank: int = 0) -> dict[str, Any]:
    """The panel's content for a step of a rank (`problem_lines`); an empty panel when there is no step."""
    if not run or step is None:
        return problem_lines(None)
    try:
        return problem_lines(data.graph(run, step, rank))
    except StoreError:
        return problem_lines(None)


def children(info: dict[str, Any] | None) -> list[Any]:
    info = info or problem_lines(None)
    items: list[Any] = []
    for line in info["lines"]:
        body: list[Any] = [html.Span(line["label"] + ":", className=f"gs-problem-kind gs-kind-{line['kind']}"), " ",
                html.Span(line["message"], className="gs-problem-text")]
        if line["node"] is not None:
            items.append(html.Button(body, id={"type": LINE, "k": line["k"], "node": line["node"]},
                                     className="gs-problem gs-problem-node", n_clicks=0,
                                     title=f"select {line['node_name']} ({node_element(line['node'])})"))
        else:
            items.append(html.Div(body, className="gs-problem"))
    return [html.Div(["problems ", html.Span(info["badge"], className="gs-problems-count"
                                             + (" gs-problems-some" if info["count"] else ""))],
                     className="gs-problems-head"),
            html.Div(items, className="gs-problems-list")] + (
                [html.Div(info["not_in_step"], className="gs-problems-quiet")] if info.get("not_in_step") else [])


def panel(info: dict[str, Any] | None = None) -> Any:
    """The panel as first served (`info`: `lines_of` the step the page opens on)."""
    return html.Div(id=ids.PROBLEMS, className="gs-problems", children=children(info))


def register(app: dash.Dash, data: PageData) -> None:
    @app.callback(Output(ids.PROBLEMS, "children"), Input(ids.RUN_SELECT, "value"), Input(ids.STEP_SELECT, "value"),
                  Input(ids.RANK_SELECT, "value"), prevent_initial_call=True)  # first load: the layout holds them
    def show_problems(run: str | None, step: int | None, rank: int | None) -> Any:
        return children(lines_of(data, run, step, int(rank or 0)))

    # A click on a line → `ids.PROBLEM_PICK`, in the browser; the selection follows on the server. The lines
    # are re-rendered with every step, so a server callback with them as inputs lost a click made while a run
    # streamed (Dash drops the answer of a callback whose input changes while it is in flight).
    app.clientside_callback(ClientsideFunction("gradscape", "problemPick"), Output(ids.PROBLEM_PICK, "data"),
                            Input({"type": LINE, "k": ALL, "node": ALL}, "n_clicks"),
                            State(ids.RUN_SELECT, "value"), State(ids.STEP_SELECT, "value"),
                            State(ids.RANK_SELECT, "value"), prevent_initial_call=True)

    @app.callback(Output(ids.SELECTED, "data", allow_duplicate=True),
                  Output(ids.COLLAPSED, "data", allow_duplicate=True),
                  Output(ids.URL, "search", allow_duplicate=True),
                  Input(ids.PROBLEM_PICK, "data"), State(ids.COLLAPSED, "data"), prevent_initial_call=True)
    def select_problem(pick: dict[str, Any] | None, collapsed: dict[str, Any] | None) -> Any:
        if not pick or not pick.get("run") or pick.get("step") is None or pick.get("node") is None:
            return no_update, no_update, no_update
        run, step, node, rank = pick["run"], int(pick["step"]), int(pick["node"]), int(pick.get("rank") or 0)
        try:
            wire = data.graph(run, step, rank)
        except StoreError:
            return no_update, no_update, no_update
        if not 0 <= node < len(wire["nodes"]):
            return no_update, no_update, no_update
        folded = collapsed.get("collapsed") if collapsed and collapsed.get("run") == run else None
        current = data.layout(run, step, folded, rank)["collapsed"]
        new_folded = view.reveal_node(wire, current, node)
        sel = {"run": run, "rank": rank, "step": step, "node": node}
        return sel, ({"run": run, "collapsed": new_folded} if new_folded != current else no_update), address(sel)
