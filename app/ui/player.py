"""The backward player: play/pause and speed on the server, stepping and painting in the browser
(`gradscape.advance`, `gradscape.player`, `gradscape.focus` in assets/player.js), so stepping through
thousands of elements never round-trips through Python."""

from __future__ import annotations

import dash
from dash import ClientsideFunction, Input, Output, State, ctx

from gradscape.app.ui import ids

# the play button's look and name while stopped and while playing (its icon: assets/icons.css)
PLAY_CLASS, PAUSE_CLASS = "gs-btn gs-icon gs-icon-play", "gs-btn gs-icon gs-icon-pause"
PLAY_TITLE, PAUSE_TITLE = "play (space)", "pause (space)"


def register(app: dash.Dash) -> None:
    @app.callback(Output(ids.TICKER, "disabled"), Output(ids.PLAY, "className"), Output(ids.PLAY, "title"),
                  Output(ids.TICKER, "interval"), Input(ids.PLAY, "n_clicks"), Input(ids.SPEED, "value"),
                  State(ids.TICKER, "disabled"), prevent_initial_call=True)
    def play(n: int | None, speed: int | None, disabled: bool) -> tuple[bool, str, str, int]:
        if ctx.triggered_id == ids.PLAY:
            disabled = not disabled
        return (disabled, PLAY_CLASS if disabled else PAUSE_CLASS, PLAY_TITLE if disabled else PAUSE_TITLE,
                int(speed or 400))

    app.clientside_callback(ClientsideFunction("gradscape", "advance"), Output(ids.SLIDER, "value"),
                            Input(ids.TICKER, "n_intervals"), Input(ids.PREV, "n_clicks"),
                            Input(ids.NEXT, "n_clicks"), State(ids.SLIDER, "value"), State(ids.SLIDER, "max"),
                            prevent_initial_call=True)
    app.clientside_callback(ClientsideFunction("gradscape", "player"), Output(ids.PLAYER_INFO, "children"),
                            Input(ids.SLIDER, "value"), Input(ids.EXEC_ORDER, "data"), Input(ids.GRAPH, "elements"),
                            State(ids.SLIDER, "max"))
    app.clientside_callback(ClientsideFunction("gradscape", "focus"), Output(ids.GRAPH, "className"),
                            Input(ids.SELECTED, "data"), Input(ids.EXEC_ORDER, "data"))
