"""The memory sink: the most recent steps, in this process (`Tracer.steps`)."""

from __future__ import annotations

from collections import deque

from gradscape.tracer._model import StepTrace


class MemorySink:
    """Keeps the most recent `keep` steps in memory (`steps`)."""

    def __init__(self, keep: int = 2) -> None:
        self.steps: deque[StepTrace] = deque(maxlen=max(1, keep))
        self.stats: dict[str, int] = {}  # nothing is sent anywhere: it does not count in tr.stats

    def write(self, st: StepTrace) -> None:
        """Keep the step (the oldest goes past `keep`)."""
        self.steps.append(st)

    def close(self, timeout: float = 10.0) -> None:
        """Nothing to flush: the kept steps stay readable."""
        return None
