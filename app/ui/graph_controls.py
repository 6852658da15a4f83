"""Graph-view callbacks beside `callbacks.py`: the search box of a big step, answered on the server.

A step of thousands of nodes would ship every node as a search option and keep the browser busy
indexing them (seconds at 10,000 nodes, during which a click on the graph waits); for such a step
`view.search_index` gives the first options only and what the user types is searched here.
The graph's "fit" and "zoom to selection" buttons work in the browser (assets/graph.js).
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, no_update

from gradscape.app import view
from gradscape.app.ui import ids
from gradscape.tracer.store import StoreError


def register(app: dash.Dash, data: Any) -> None:
    """`data`: the page's `app.ui.data.UIData` (its cache of decoded steps)."""

    @app.callback(Output(ids.SEARCH, "options", allow_duplicate=True), Input(ids.SEARCH, "search_value"),
                  State(ids.RUN_SELECT, "value"), State(ids.STEP_SELECT, "value"), State(ids.RANK_SELECT, "value"),
                  State(ids.SEARCH, "value"), State(ids.SEARCH, "options"), prevent_initial_call=True)
    def search_big_step(query: str | None, run: str | None, step: int | None, rank: int | None, value: str | None,
                        options: list[dict[str, str]] | None) -> Any:
        if not query or not run or step is None:
            return no_update
        try:
            wire = data.graph(run, step, int(rank or 0))
        except StoreError:
            return no_update
        if not view.searched_on_server(wire):
            return no_update  # every option is in the browser already
        hits = view.search(wire, query, limit=view.SEARCH_HITS)
        kept = [o for o in options or [] if o.get("value") == value and o not in hits]
        return kept + hits
