"""The Dash page: the layout (`page`) and one module per panel, each with its callbacks: the header's
run and step lists (`runs`), the graph (`graph`), node selection and folds (`selection`), the inspector
(`inspector`), the backward player (`player`), the problems panel (`problems`), what a step says of
torch.compile (`compiled`: notes, the compiled-against-eager table, its colouring), ranks and the compare view
(`compare`), breakpoints (`debugger`), the run's history (`timeline`); the page's address (`address`)
and element ids (`ids`). Everything they read comes through `app.data.PageData`; callbacks are small,
the work is done by `app.view` (which imports no Dash). The page's scripts are in assets/."""

from __future__ import annotations

import dash

from gradscape.app.data import PageData


def register(app: dash.Dash, data: PageData, token: str | None) -> None:
    """Every panel's callbacks, and the page as the layout (the newest step already drawn)."""
    from gradscape.app.ui import (
        compare,
        compiled,
        debugger,
        graph,
        inspector,
        page,
        player,
        problems,
        runs,
        selection,
        timeline,
    )

    # `compare` first: its `sync_ranks` must be registered before `runs.sync_steps`. A deep link naming
    # another rank and a step changes both, and the step list reads the rank; registered the other way
    # round, a link to rank 1's step 0 kept step 1 shown (tests/e2e/test_compare.py). The rest keep the
    # order they were always registered in.
    for panel in (compare, runs, graph, selection, inspector):
        panel.register(app, data)
    player.register(app)
    problems.register(app, data)
    compiled.register(app, data)
    debugger.register(app, data)
    timeline.register(app, data)  # the run's history: registered last, where it always was
    app.layout = page.layout_function(data, token)
