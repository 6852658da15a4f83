"""The header's lists: the run select and the step list (with "follow live"), the deep link that can
set both, and the connection badge.

Live data: the /ui socket only says *what changed* ("run r has step 12"); the lists are read again from
the JSON API, in the browser (`liveRuns`, `liveSteps` in assets/live.js), so merged notifications lose
nothing and no server callback's answer is dropped by Dash when its input changes while it is in flight.
A deep link (`deepLink` in assets/links.js) and another run or rank chosen are answered on the server here.

NOTE [Who changed the step]: "follow live" goes off when the *person* picks a step other than the newest
(in the step list; the timeline and a link naming a step turn it off themselves), never when the page
changed the step on its own. Every step the page sets itself (`sync_steps` here for a run, rank or link
chosen; `liveSteps` in assets/live.js for a new step while following) is also written into
`ids.STEP_SET_BY_PAGE` in the same update, so `stepPicked` tells the two apart by who set the value rather
than by whether the step list has caught up with it. Judged by the list alone, a link naming only the run
raced: `sync_steps` answered with the step the page was rendered with while newer steps had arrived, and that
older step, though the page's own choice, turned following off (tests/e2e/test_live.py).
"""

from __future__ import annotations

import time
from typing import Any

import dash
from dash import ClientsideFunction, Input, Output, State, ctx, no_update

from gradscape.app.data import PageData
from gradscape.app.step_flags import next_flagged, root_cause, run_label, step_label
from gradscape.app.ui import ids
from gradscape.app.ui.address import link_rank
from gradscape.tracer.store import StoreError


def register(app: dash.Dash, data: PageData) -> None:
    # ?run=&rank=&step=&node= → {run, rank, step, node} in ids.DEEP_LINK, or nothing without a link (the page
    # was rendered with the newest step already). Set with set_props, not as this callback's output: the
    # selection callbacks write the address (ids.URL) and read the link, so a declared output closed a loop
    # in Dash's callback graph. Dash holds back a callback while one upstream of its inputs is pending, and
    # in that loop each one is upstream of itself: Dash broke the loop only when nothing else was in flight,
    # so a click answered while another callback was in flight left the inspector and the graph's focus
    # waiting for the next notification (tests/app/test_callback_graph.py)
    app.clientside_callback(ClientsideFunction("gradscape", "deepLink"), Input(ids.URL, "search"),
                            State(ids.SELECTED, "data"))

    @app.callback(Output(ids.RUN_SELECT, "options"), Output(ids.RUN_SELECT, "value"),
                  Input(ids.DEEP_LINK, "data"), State(ids.RUN_SELECT, "value"),
                  prevent_initial_call=True)  # first load: the layout already holds the runs
    def sync_runs(link: dict[str, Any] | None, current: str | None) -> tuple[Any, Any]:
        return run_choices(data, link, current)

    # a new run, announced on the socket → the run list, read from the JSON API in the browser; a new step
    # → the same list again for its step counts (the labels only: the run shown stays)
    app.clientside_callback(ClientsideFunction("gradscape", "liveRuns"), Output(ids.LIVE_RUNS, "data"),
                            Input(ids.SOCKET, "data-run"), Input(ids.SOCKET, "data-step"),
                            State(ids.RUN_SELECT, "value"), State(ids.RUN_SELECT, "options"),
                            prevent_initial_call=True)

    @app.callback(Output(ids.STEP_SELECT, "options"), Output(ids.STEP_SELECT, "value"),
                  Output(ids.STEP_SET_BY_PAGE, "data"),
                  Input(ids.RUN_SELECT, "value"), Input(ids.DEEP_LINK, "data"), Input(ids.RANK_SELECT, "value"),
                  State(ids.STEP_SELECT, "value"),
                  prevent_initial_call=True)  # first load: the layout already holds the steps
    def sync_steps(run: str | None, link: dict[str, Any] | None, rank: int | None,
                   current: int | None) -> tuple[Any, Any, Any]:
        """The steps of the run's shown rank (the rank is set first: `compare.sync_ranks`), and the step
        shown, marked as the page's own (NOTE [Who changed the step])."""
        fired = ctx.triggered_prop_ids  # several can change in one update: the deep link wins
        trigger = ids.DEEP_LINK if f"{ids.DEEP_LINK}.data" in fired else ids.RUN_SELECT
        options, value = step_choices(data, run, link, current, trigger, int(rank or 0))
        return options, value, {"step": value}

    # A `step` notification (or the server's catch-up when the socket (re)connects) → the steps of the
    # shown rank, read from the JSON API in the browser and set on the step list there (a lost update left
    # the list a step behind when this was a server callback). Another run or rank chosen only tells the
    # browser which list an answer must be for.
    app.clientside_callback(ClientsideFunction("gradscape", "liveSteps"), Output(ids.LIVE_STEPS, "data"),
                            Input(ids.SOCKET, "data-step"), Input(ids.RUN_SELECT, "value"),
                            Input(ids.RANK_SELECT, "value"), State(ids.STEP_SELECT, "value"),
                            State(ids.STEP_SELECT, "options"), State(ids.FOLLOW, "value"),
                            State(ids.RANK_SELECT, "options"), prevent_initial_call=True)

    # a step other than the newest picked by the person while following the live run: following stops,
    # visibly, so the next step streamed does not take the step away (`stepPicked`). A step the page showed
    # itself never does (NOTE [Who changed the step])
    app.clientside_callback(ClientsideFunction("gradscape", "stepPicked"),
                            Output(ids.FOLLOW, "value", allow_duplicate=True), Input(ids.STEP_SELECT, "value"),
                            State(ids.STEP_SELECT, "options"), State(ids.FOLLOW, "value"),
                            State(ids.STEP_SET_BY_PAGE, "data"), prevent_initial_call=True)

    # "next problem": the next step traced by a trigger or with problems, opened on its root-cause node, as a
    # deep link would open it; the page stops following the live run there (visibly)
    @app.callback(Output(ids.DEEP_LINK, "data", allow_duplicate=True),
                  Output(ids.FOLLOW, "value", allow_duplicate=True), Input(ids.NEXT_PROBLEM, "n_clicks"),
                  State(ids.RUN_SELECT, "value"), State(ids.RANK_SELECT, "value"),
                  State(ids.STEP_SELECT, "value"), prevent_initial_call=True)
    def go_next_problem(_clicks: int | None, run: str | None, rank: int | None, step: int | None) -> tuple[Any, Any]:
        link = next_problem(data, run, int(rank or 0), step)
        return (link, []) if link else (no_update, no_update)

    # "live" (with the tracer's counts) / "offline" / "connecting…", in the browser: tracer status
    # notifications arrive up to ten times a second
    app.clientside_callback(ClientsideFunction("gradscape", "connection"), Output(ids.CONNECTION, "children"),
                            Output(ids.CONNECTION, "className"), Input(ids.SOCKET, "connected"),
                            Input(ids.SOCKET, "data-tracer"))


def next_problem(data: PageData, run: str | None, rank: int, step: int | None) -> dict[str, Any] | None:
    """Where "next problem" goes: the first flagged step after `step` (round to the first), with its root-cause
    node, as a deep link (`{run, rank, step, node, at}`); None when no step of the run is flagged."""
    if not run:
        return None
    target = next_flagged(data.flags.of(run, rank), step)
    if target is None:
        return None
    try:
        node = root_cause(data.graph(run, target, rank))
    except StoreError:
        return None
    return {"run": run, "rank": rank, "step": target, **({"node": node} if node is not None else {}),
            "at": time.time()}  # a new link each time: the same step picked again selects its node again


def run_choices(data: PageData, link: dict[str, Any] | None, current: str | None) -> tuple[Any, Any]:
    """The runs as options, and the one to show: a deep link's, else the current one, else the newest."""
    runs = data.runs()
    names = [r["run"] for r in runs]
    options = [{"label": run_label(r["run"], r["steps"], data.flags.flagged(r["run"])), "value": r["run"]}
               for r in runs]
    if link and link.get("run") in names:
        return options, link["run"]
    if current in names:
        return options, current
    return options, names[-1] if names else None


def step_choices(data: PageData, run: str | None, link: dict[str, Any] | None, current: int | None,
                 trigger: Any = None, rank: int = 0) -> tuple[Any, Any]:
    """The steps of the run's `rank` as options, and the one to show: a deep link's (naming this run and
    rank), else the current one, else the newest. (Live notifications are handled in the browser:
    `liveSteps`.)"""
    if not run:
        return [], None
    steps = data.steps(run, rank)
    flags = data.flags.of(run, rank, steps)
    options = [{"label": step_label(s, flags[s]), "value": s} for s in steps]
    if not steps:
        return options, None
    if link and link.get("run") == run and link_rank(link) == rank and link.get("step") in steps and \
            (current is None or trigger == ids.DEEP_LINK):
        return options, link["step"]
    if current not in steps:
        return options, steps[-1]
    return options, current
