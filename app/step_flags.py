"""Which stored steps a person should look at first (`StepFlags`): each step's trigger (why the monitor traced
it, None for a scheduled step) and its count of problems, for the step list ("step 63 · nonfinite · 2
problems"), the run list ("r (16 steps · 2 flagged)") and the page's "next problem" button. A stored step
never changes, so each is read once (its trigger and problems only: the step's nodes stay undecoded,
`TraceStore.read_indexed`) and kept for the server's life: two small values a step. No Dash."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from gradscape.tracer.store import StoreError, TraceStore
from gradscape.tracer.wire import TraceFormatError, WireStep


class Flag(NamedTuple):
    trigger: str | None
    problems: int

    @property
    def flagged(self) -> bool:
        return bool(self.trigger) or self.problems > 0


NONE = Flag(None, 0)


def step_label(step: int, flag: Flag) -> str:
    """The step list's label (assets/live.js `stepLabel` words it the same)."""
    parts = [f"step {step}"] + ([flag.trigger] if flag.trigger else []) + (
        [f"{flag.problems} problem" + ("s" if flag.problems != 1 else "")] if flag.problems else [])
    return " · ".join(parts)


def run_label(run: str, steps: int, flagged: int) -> str:
    """The run list's label (assets/live.js `runLabel` words it the same)."""
    return f"{run} ({steps} steps" + (f" · {flagged} flagged)" if flagged else ")")


def root_cause(wire: WireStep) -> int | None:
    """The node a flagged step opens on: its first problem's node (problems come root cause first), else
    where its backward started (the loss)."""
    nodes = len(wire["nodes"])
    for p in wire["problems"]:
        if isinstance(p["node"], int) and 0 <= p["node"] < nodes:
            return int(p["node"])
    for ps in wire["passes"]:
        for r in ps["roots"]:
            if 0 <= r < nodes:
                return int(r)
    return None


def next_flagged(flags: dict[int, Flag], current: int | None) -> int | None:
    """The first flagged step after `current`, round to the first of all; None when none is flagged."""
    marked = sorted(s for s, f in flags.items() if f.flagged)
    if not marked:
        return None
    return next((s for s in marked if current is None or s > current), marked[0])


class StepFlags:
    """The flags of the steps of a store, each read once."""

    def __init__(self, store: TraceStore, read: Callable[[str, int, int], WireStep] | None = None) -> None:
        self.store = store
        self.read = read or store.read_indexed  # a step's wire form (the page's reads it from its own cache)
        self._known: dict[tuple[str, int, int], Flag] = {}
        self._lock = threading.Lock()

    def of(self, run: str, rank: int = 0, steps: list[int] | None = None) -> dict[int, Flag]:
        """Step → its flag, for the steps of `run` on `rank` (or those given)."""
        wanted = steps if steps is not None else [s["step"] for s in self.store.steps(run, int(rank))]
        return {s: self.flag(run, s, rank) for s in wanted}

    def flag(self, run: str, step: int, rank: int = 0) -> Flag:
        key = (run, int(rank), int(step))
        with self._lock:
            if key in self._known:
                return self._known[key]
        try:
            wire = self.read(run, int(step), int(rank))
            found = Flag(wire.get("trigger"), len(wire["problems"]))
        except (StoreError, TraceFormatError):
            return NONE  # not kept: a step being written can be read later
        with self._lock:
            self._known[key] = found
        return found

    def flagged(self, run: str) -> int:
        """How many steps of `run` (rank 0, as the run list counts them) are flagged."""
        return sum(1 for f in self.of(run).values() if f.flagged)

    def step_json(self, run: str, rank: int, step: int) -> dict[str, Any]:
        f = self.flag(run, step, rank)
        return {"trigger": f.trigger, "problems": f.problems}
