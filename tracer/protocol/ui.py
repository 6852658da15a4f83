"""`/ui`: the light notifications the server pushes to the page. Never data: each says which run changed,
and the page reads the state from the JSON API or its callbacks read the store, so notifications that
merge lose nothing (Dash props are state, not events). The page sends nothing but its token.

    run          {"run": "my-run"}                                   a new run has a stored step
    step         {"run": "my-run", "step": 7}                        (`"rank": 2` too on a rank but 0)
    history      {"run": "my-run", "step": 812}                      the run's history reaches step 812
    tracer       {"run": "my-run", "state": "connected"|"gone", "sent": 10, "spilled": 2, "dropped": 0}
    paused       {"run": "my-run", "at": 1763750000.5}               paused or resumed (`/debug`)
    breakpoints  {"run": "my-run", "at": 1763750000.5}               its breakpoints changed

On connecting, a page gets two catch-ups, read like any other notification: a `step` with
`"run": null, "catchup": true, "runs": [...]` (steps and runs may have been stored while it was not
listening) and a `paused` with `"runs": [...], "catchup": true` (the runs that are paused or have
breakpoints). `at` (the server's clock) makes
each of those a new value: Dash fires a callback only when a prop changes.
"""

from __future__ import annotations

import time
from typing import Any

UI_NAMESPACE = "/ui"
UI_EVENTS = ("run", "step", "history", "tracer", "paused", "breakpoints")
TRACER_STATES = ("connected", "gone")


def run_note(run: str) -> dict[str, Any]:
    return {"run": run}


def step_note(run: str, step: int, rank: int = 0) -> dict[str, Any]:
    return {"run": run, "step": step, **({"rank": rank} if rank else {})}


def history_note(run: str, step: int, rank: int = 0) -> dict[str, Any]:
    """`history`: the rows of `run` (on `rank`) now reach `step`."""
    return {"run": run, "step": step, **({"rank": rank} if rank else {})}


def tracer_note(run: str, state: str, stats: dict[str, int]) -> dict[str, Any]:
    if state not in TRACER_STATES:
        raise ValueError(f"a tracer's state is one of {TRACER_STATES}, got {state!r}")
    return {"run": run, "state": state, **stats}


def changed_note(run: str) -> dict[str, Any]:
    """`paused` or `breakpoints`: that run's debugger state changed."""
    return {"run": run, "at": time.time()}


def step_catchup(runs: list[str]) -> dict[str, Any]:
    """The `step` catch-up a page gets on connecting; `runs`: every run the server holds, so the page sees a
    run that began while it was not listening (its `run` notification went to nobody there)."""
    return {"run": None, "step": None, "catchup": True, "runs": runs, "at": time.time()}


def paused_catchup(runs: list[str]) -> dict[str, Any]:
    return {"runs": runs, "catchup": True, "at": time.time()}
