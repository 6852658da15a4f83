"""The `/ui` pushes (`tracer.protocol.ui`), coalesced and sent from one thread."""

from __future__ import annotations

import threading
import time
from typing import Any

from flask_socketio import SocketIO

from gradscape.tracer import protocol


class Notifier:
    """Coalesces /ui notifications and pushes them at most every `interval` seconds from one thread.
    A notification only says what changed; the page reads the current state from the store, so
    nothing is lost when several merge (Dash props are state, not events: docs/web-stack.md).

    A step notification names its rank when it is not 0 (`{"run", "step", "rank"}`): the page hears a
    prop change only when the value differs, and each rank of a distributed run stores the same step
    numbers, often one after the other. The debugger's `paused` and `breakpoints` notifications are rare
    and go out at once (`changed`)."""

    def __init__(self, socketio: SocketIO, interval: float) -> None:
        self.socketio = socketio
        self.interval = interval
        self._lock = threading.Lock()
        self._steps: dict[tuple[str, int], int] = {}
        self._runs: list[str] = []
        self._tracers: dict[str, dict[str, Any]] = {}
        self._history: dict[tuple[str, int], int] = {}  # (run, rank) → the last step of its history rows
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Any = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = self.socketio.start_background_task(self._loop)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the push thread and wait (up to `timeout`) until it has ended."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and hasattr(thread, "join") and thread is not threading.current_thread():
            thread.join(timeout)

    def step(self, run: str, step: int, rank: int = 0) -> None:
        with self._lock:
            self._steps[(run, rank)] = max(step, self._steps.get((run, rank), -1))
        self._wake.set()

    def run(self, run: str) -> None:
        with self._lock:
            if run not in self._runs:
                self._runs.append(run)
        self._wake.set()

    def history(self, run: str, step: int, rank: int = 0) -> None:
        with self._lock:
            self._history[(run, rank)] = max(step, self._history.get((run, rank), -1))
        self._wake.set()

    def tracer(self, run: str, state: str, stats: dict[str, int]) -> None:
        with self._lock:
            self._tracers[run] = protocol.tracer_note(run, state, stats)
        self._wake.set()

    def changed(self, event: str, run: str) -> None:
        """`paused` or `breakpoints`: the run's debugger state changed (the page reads it from the JSON API)."""
        self.socketio.emit(event, protocol.changed_note(run), namespace=protocol.UI_NAMESPACE)

    def _loop(self) -> None:
        ns = protocol.UI_NAMESPACE
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                runs, self._runs = self._runs, []
                steps, self._steps = self._steps, {}
                tracers, self._tracers = self._tracers, {}
                history, self._history = self._history, {}
            for r in runs:
                self.socketio.emit("run", protocol.run_note(r), namespace=ns)
            for (r, rank), s in steps.items():
                self.socketio.emit("step", protocol.step_note(r, s, rank), namespace=ns)
            for t in tracers.values():
                self.socketio.emit("tracer", t, namespace=ns)
            for (r, rank), s in history.items():
                self.socketio.emit("history", protocol.history_note(r, s, rank), namespace=ns)
            time.sleep(self.interval)
