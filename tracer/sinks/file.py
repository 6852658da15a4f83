"""The file sink: every step (and the monitor's history rows) appended to a SQLite trace file (`tracer.store`)."""

from __future__ import annotations

from pathlib import Path

from gradscape.tracer._model import StepTrace
from gradscape.tracer.wire.history import WireHistory


class FileSink:
    """Appends every step to a SQLite trace file, one transaction per step. `keep_last=N` keeps only
    the newest N steps of the run (and rank) in the file, so a run that traces for days stays bounded:
    `Tracer(model, sink=FileSink("run.sqlite", keep_last=100))`."""

    def __init__(self, path: str | Path, keep_last: int | None = None) -> None:
        from gradscape.tracer.store import TraceStore

        self.path = str(path)
        self.store = TraceStore(self.path, keep_last=keep_last)
        self.stats = {"written": 0, "dropped": 0}

    def write(self, st: StepTrace) -> None:
        """Append the step to the trace file (one transaction), counted in `stats` as written or dropped."""
        try:
            self.store.write_step(st)
            self.stats["written"] += 1
        except Exception:
            self.stats["dropped"] += 1
            raise

    def write_history(self, batch: WireHistory) -> None:
        """The monitor's history rows (`tracer.wire.history`), one transaction per batch."""
        self.store.write_history(batch)

    def close(self, timeout: float = 10.0) -> None:
        """Close the trace file."""
        self.store.close()
