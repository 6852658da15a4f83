"""Where finished steps go. A sink has `write(StepTrace)`, `close(timeout)` and `stats`.

The memory sink keeps the last `keep` steps; the file sink appends to a SQLite trace file
(`tracer.store`). The socket sink (live server) builds on the same interface.
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gradscape.tracer._model import StepTrace

log = logging.getLogger(__name__)


@runtime_checkable
class Sink(Protocol):
    stats: dict[str, int]

    def write(self, st: StepTrace) -> None: ...

    def close(self, timeout: float = 10.0) -> None: ...


class MemorySink:
    """Keeps the most recent `keep` steps in memory (`steps`)."""

    def __init__(self, keep: int = 2) -> None:
        self.steps: deque[StepTrace] = deque(maxlen=max(1, keep))
        self.stats: dict[str, int] = {}  # nothing is sent anywhere: it does not count in tr.stats

    def write(self, st: StepTrace) -> None:
        self.steps.append(st)

    def close(self, timeout: float = 10.0) -> None:
        return None


class FileSink:
    """Appends every step to a SQLite trace file, one transaction per step."""

    def __init__(self, path: str | Path) -> None:
        from gradscape.tracer.store import TraceStore

        self.path = str(path)
        self.store = TraceStore(self.path)
        self.stats = {"written": 0, "dropped": 0}

    def write(self, st: StepTrace) -> None:
        try:
            self.store.write_step(st)
            self.stats["written"] += 1
        except Exception:
            self.stats["dropped"] += 1
            raise

    def write_history(self, batch: Any) -> None:
        """The monitor's history rows (`tracer.history_wire`), one transaction per batch."""
        self.store.write_history(batch)

    def close(self, timeout: float = 10.0) -> None:
        self.store.close()


def resolve_sinks(sink: Any, keep: int = 2, run: str = "run") -> list[Sink]:
    """Turn the `sink=` argument into sink objects; a memory sink is always first."""
    items = sink if isinstance(sink, (list, tuple)) else [] if sink is None else [sink]
    out: list[Sink] = [MemorySink(keep)]
    for s in items:
        if isinstance(s, (str, Path)):
            text = str(s)
            if text.startswith(("http://", "https://")):
                from gradscape.tracer._socket_sink import SocketSink

                out.append(SocketSink(text, run))
                continue
            if text.endswith((".sqlite", ".db", ".sqlite3")):
                out.append(FileSink(text))
                continue
            raise ValueError(f"sink {text!r}: expected a path ending in .sqlite/.db or an http:// URL")
        if hasattr(s, "write") and hasattr(s, "close"):
            if not hasattr(s, "stats"):
                s.stats = {}
            out.append(s)
            continue
        raise TypeError(f"sink must be None, a path, a URL or an object with write()/close(), got {type(s).__name__}")
    return out
