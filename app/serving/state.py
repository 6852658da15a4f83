"""What one server holds, each piece with one owner: `ServerState` (the store, the tracers connected, the
steps half received) and, inside it, `DebugState` (each run's breakpoints and where it is paused). Both
are made by `create_app` and read by the namespaces, the JSON API and the page's data source."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gradscape.app.serving.notifier import Notifier
from gradscape.app.serving.security import ServerConfig
from gradscape.app.step_flags import StepFlags
from gradscape.tracer import protocol
from gradscape.tracer._model import StepTrace
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire.history import WireHistory

MAX_BREAKPOINTS = 64


@dataclass
class ChunkedStep:
    """A step arriving in `step_chunk`s: the parts received so far."""

    run: str
    step: int
    chunks: int
    parts: dict[int, bytes] = field(default_factory=dict)
    size: int = 0


class TooManyBreakpoints(ValueError):
    """A run already has `MAX_BREAKPOINTS` breakpoints."""


@dataclass
class DebugState:
    """Each run's breakpoints (pushed to its tracers on `/debug`) and, while a run is paused, the partial
    backward its tracer sent (`protocol.check_paused`: the listing, and its thumbnails apart)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    breakpoints: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    paused: dict[str, dict[str, Any]] = field(default_factory=dict)  # run → the pause, + "thumbs", "sid", "since"
    sessions: dict[str, str] = field(default_factory=dict)  # /debug sid → run

    def points(self, run: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.breakpoints.get(run, []))

    def add_point(self, run: str, bp: dict[str, Any]) -> list[dict[str, Any]]:
        """Add a breakpoint (already `check_breakpoint`ed; a duplicate is kept once); the run's list after."""
        with self.lock:
            points = self.breakpoints.setdefault(run, [])
            if bp not in points:
                if len(points) >= MAX_BREAKPOINTS:
                    raise TooManyBreakpoints(f"run {run!r} already has {MAX_BREAKPOINTS} breakpoints")
                points.append(bp)
            return list(points)

    def clear_points(self, run: str) -> None:
        with self.lock:
            self.breakpoints.pop(run, None)

    def hello(self, sid: str, run: str) -> list[dict[str, Any]]:
        """A tracer of `run` connected on `/debug` as `sid`: the run's breakpoints."""
        with self.lock:
            self.sessions[sid] = run
            return list(self.breakpoints.get(run, []))

    def gone(self, sid: str) -> str | None:
        """A `/debug` connection ended: the run whose pause ended with it (its tracer can no longer be
        resumed), or None."""
        with self.lock:
            run = self.sessions.pop(sid, None)
            if run is None or self.paused.get(run, {}).get("sid") != sid:
                return None
            del self.paused[run]
            return run

    def pause(self, run: str, pause: dict[str, Any], thumbs: protocol.Thumbs, sid: str) -> None:
        with self.lock:
            self.paused[run] = {**pause, "thumbs": thumbs, "sid": sid, "since": time.time()}

    def resume(self, run: str) -> str | None:
        """Forget the run's pause; the sid of the tracer to resume, or None when it was not paused."""
        with self.lock:
            p = self.paused.pop(run, None)
        return None if p is None else str(p["sid"])

    def where(self, run: str) -> dict[str, Any] | None:
        """`{"step", "node", "executed"}` of the run's pause, None when it is not paused."""
        with self.lock:
            p = self.paused.get(run)
            return None if p is None else {"step": p["step"], "node": p["node"], "executed": p["executed"]}

    def listing(self, run: str) -> dict[str, Any] | None:
        """The pause with every node run so far (statistics, no thumbnails); None when not paused."""
        with self.lock:
            p = self.paused.get(run)
            return None if p is None else {"step": p["step"], "node": p["node"], "executed": p["executed"],
                                           "nodes": p["nodes"]}

    def active_runs(self) -> list[str]:
        """The runs that are paused or have breakpoints."""
        with self.lock:
            return sorted(set(self.paused) | {r for r, p in self.breakpoints.items() if p})

    def has_session(self, run: str) -> bool:
        with self.lock:
            return run in self.sessions.values()

    def paused_node(self, run: str, node: int, order: int | None = None) -> tuple[dict[str, Any] | None,
                                                                                 dict[str, Any] | None]:
        """(where the run is paused, one node run so far with its thumbnails); (None, None) when the run
        is not paused, (paused, None) when that node has not run yet in the paused backward. The node's
        newest run, or the one at execution position `order`. Its tensors carry `"thumb"`: the
        `encode_array` map the tracer sent, or None (over the tracer's budget, or no thumbnail)."""
        with self.lock:
            p = self.paused.get(run)
            if p is None:
                return None, None
            where = {"run": run, "step": p["step"], "node": p["node"], "executed": p["executed"]}
            nodes, thumbs = p["nodes"], p["thumbs"]
            pos = next((k for k in range(len(nodes) - 1, -1, -1) if nodes[k]["id"] == node
                        and (order is None or nodes[k]["order"] == order)), None)
            if pos is None:
                return where, None
            n = nodes[pos]
            doc = {**n, "runs": sum(1 for m in nodes if m["id"] == node)}
            for kind in protocol.SLOTS:
                ts = n[kind]
                doc[kind] = None if ts is None else [
                    None if t is None else {**t, "thumb": thumbs.get((pos, kind, j))} for j, t in enumerate(ts)]
            return where, doc


@dataclass
class ServerState:
    store: TraceStore
    config: ServerConfig
    notifier: Notifier
    debug: DebugState = field(default_factory=DebugState)
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: dict[tuple[str, str, int], ChunkedStep] = field(default_factory=dict)  # (sid, run, step) →
    sessions: dict[str, str] = field(default_factory=dict)  # /tracer sid → run
    tracer_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    known_runs: set[str] = field(default_factory=set)
    owns_store: bool = False  # create_app opened it, so close() closes it
    closed: bool = False
    flags: StepFlags = field(init=False)  # each stored step's trigger and problem count, read once

    def __post_init__(self) -> None:
        self.flags = StepFlags(self.store)

    def has_run(self, run: str) -> bool:
        """A run with a stored step or a tracer connected (on either namespace)."""
        if run in self.known_runs or run in list(self.sessions.values()) or self.debug.has_session(run):
            return True
        return any(r["run"] == run for r in self.store.runs())

    def store_step(self, step: StepTrace) -> None:
        """Keep one step in the trace file, in the schema's own form (`TraceStore.write_step`), and tell the
        pages (a run's first step also announces the run)."""
        self.store.write_step(step)
        self._stored(step.run, step.step, step.rank or 0)

    def store_columns(self, doc: dict[str, Any], arrays: Any) -> None:
        """`store_step` of a step sent as columns: its checked document and arrays (`tracer.wire.column_check`)."""
        self.store.write_wire(doc, arrays)
        self._stored(doc["run"], doc["step"], doc["rank"] or 0)

    def _stored(self, run: str, step: int, rank: int) -> None:
        self._announce_run(run)
        self.notifier.step(run, step, rank)

    def store_history(self, batch: WireHistory) -> None:
        """Store a checked batch of the monitor's history rows and announce it (a new run, then its last step)."""
        self.store.write_history(batch)
        self._announce_run(batch["run"])
        self.notifier.history(batch["run"], max(r["step"] for r in batch["rows"]), batch["rank"] or 0)

    def _announce_run(self, run: str) -> None:
        """A run the pages have not been told of yet: tell them (once), after its first data is stored."""
        if run not in self.known_runs:
            self.known_runs.add(run)
            self.notifier.run(run)

    def close(self) -> None:
        """Stop the notifier thread; close the trace file if `create_app` opened it. Idempotent."""
        self.notifier.stop()
        if self.owns_store and not self.closed:
            self.closed = True
            self.store.close()
