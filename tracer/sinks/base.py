"""Where finished steps go. A sink has `write(StepTrace)`, `close(timeout)` and `stats` (`Sink`); a sink
with `write_history(batch)` also takes the monitor's history rows (`tracer.wire.history`). And
`resolve_sinks` turns a `Tracer`'s `sink=` argument into sink objects.

The memory sink (`sinks.memory`) keeps the last `keep` steps; the file sink (`sinks.file`) appends to a
SQLite trace file (`tracer.store`); the socket sink (`sinks.socket`) streams to a live server, spilling
to a local trace file what the server does not take.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gradscape.tracer._model import StepTrace
from gradscape.tracer.sinks.file import FileSink
from gradscape.tracer.sinks.memory import MemorySink


@runtime_checkable
class Sink(Protocol):
    """Where a `Tracer` sends each finished step: any object with `write`, `close` and `stats` (a dict of
    counts, such as `written`, `sent`, `spilled`, `dropped`, summed into `tr.stats`) can be given as `sink=`.
    A sink that also has `write_history(batch)` receives the monitor's history rows."""

    stats: dict[str, int]

    def write(self, st: StepTrace) -> None:
        """Take one finished step. What it raises is logged by the Tracer, never raised into training."""
        ...

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is still held, waiting at most `timeout` seconds; idempotent."""
        ...


def resolve_sinks(sink: Any, keep: int = 2, run: str = "run") -> list[Sink]:
    """Turn the `sink=` argument into sink objects; a memory sink is always first."""
    items = sink if isinstance(sink, (list, tuple)) else [] if sink is None else [sink]
    out: list[Sink] = [MemorySink(keep)]
    for s in items:
        if isinstance(s, (str, Path)):
            text = str(s)
            if text.startswith(("http://", "https://")):
                from gradscape.tracer.sinks.socket import SocketSink

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
