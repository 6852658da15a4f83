"""The timeline panel (`#timeline`), above the step list's graph: the run's loss, gradient norm and
GradScaler scale over every step, traced steps marked (triggered ones in red with their reason; a click
opens the step), and the layers × steps heatmap. It grows as history rows stream in (a `history`
notification on /ui): those updates patch the figures' data only, so the person's zoom and pan stay."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, Patch, State, dcc, html, no_update

from gradscape.app.data import PageData
from gradscape.app.ui import ids
from gradscape.app.ui.ids import TIMELINE, TIMELINE_GRAPH, TIMELINE_HEATMAP, TIMELINE_INFO
from gradscape.app.view.timeline import heatmap_figure, timeline_figure


def panel() -> Any:
    return html.Details(id=TIMELINE, className="gs-timeline", open=True, children=[
        html.Summary(["timeline ", html.Span(id=TIMELINE_INFO, className="gs-timeline-info")]),
        dcc.Graph(id=TIMELINE_GRAPH, config={"displaylogo": False}, figure=timeline_figure([], None),
                  className="gs-timeline-graph"),
        html.Details(className="gs-timeline-layers", children=[
            html.Summary("layers × steps (gradient norm against each layer's own median)"),
            dcc.Graph(id=TIMELINE_HEATMAP, config={"displaylogo": False}, figure=heatmap_figure([], None))]),
    ])


def register(app: dash.Dash, data: PageData) -> None:
    @app.callback(Output(TIMELINE_GRAPH, "figure"), Output(TIMELINE_HEATMAP, "figure"),
                  Output(TIMELINE_INFO, "children"),
                  Input(ids.RUN_SELECT, "value"), Input(ids.RANK_SELECT, "value"), Input(ids.SOCKET, "data-history"))
    def draw(run: str | None, rank: int | None, note: dict[str, Any] | None) -> tuple[Any, Any, Any]:
        if note is not None and run is not None and dash.ctx.triggered_id == ids.SOCKET and note.get("run") != run:
            return no_update, no_update, no_update  # another run's rows
        rows = data.history(run, int(rank or 0)) if run else []
        traced = sum(1 for r in rows if r.get("traced"))
        triggered = sum(1 for r in rows if r.get("trigger"))
        info = f"{len(rows)} steps, {traced} traced, {triggered} by a trigger" if rows else "no history for this run"
        line, layers = timeline_figure(rows, run), heatmap_figure(rows, run)
        if dash.ctx.triggered_id != ids.SOCKET:
            return line, layers, info
        # new rows of the run shown: the data changes, and the trigger labels above the plot with the margin
        # that holds them; the rest of the layout in the browser (the person's zoom and pan, which plotly
        # keeps there) is left as it is
        p_line, p_layers = Patch(), Patch()
        p_line["data"] = line["data"]
        p_line["layout"]["annotations"] = line["layout"]["annotations"]
        p_line["layout"]["margin"]["t"] = line["layout"]["margin"]["t"]
        p_layers["data"] = layers["data"]
        p_layers["layout"]["height"] = layers["layout"]["height"]
        return p_line, p_layers, info

    @app.callback(Output(ids.STEP_SELECT, "value", allow_duplicate=True), Output(ids.FOLLOW, "value",
                                                                                 allow_duplicate=True),
                  Input(TIMELINE_GRAPH, "clickData"), State(ids.STEP_SELECT, "options"), prevent_initial_call=True)
    def open_step(click: dict[str, Any] | None, options: list[dict[str, Any]] | None) -> tuple[Any, Any]:
        """A click on a traced step's mark opens that step (and stops following the live run)."""
        points = (click or {}).get("points") or []
        data = points[0].get("customdata") if points else None
        if not data:
            return no_update, no_update
        step = int(data[0])
        if options is not None and step not in {o.get("value") for o in options}:
            return no_update, no_update
        return step, []
