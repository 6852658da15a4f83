"""The socket sink's queues: steps (and batches of the monitor's history rows) waiting to be sent or
spilled, bounded in bytes (NOTE [Socket sink] in tracer/sinks/socket.py)."""

from __future__ import annotations

import threading
import time
from collections import deque

from gradscape.tracer._model import StepTrace, TensorTrace
from gradscape.tracer.wire.history import WireHistory

Queued = StepTrace | WireHistory  # what the queues hold: a step, or a batch of history rows


def estimate_bytes(st: StepTrace) -> int:
    """Cheap size estimate for the queue bound (the exact size is known only once encoded). A natively
    recorded step is sized from its tensor table (NOTE [Step tables] in tracer/record/tables.py): the
    training loop's write makes no `NodeTrace`."""
    tables = getattr(st.nodes, "tables", None)
    if tables is not None:
        tab = tables.tensors
        return (600 * len(st.nodes) + 120 * len(tab) + tab.arena_bytes()
                + sum(_tensor_bytes(t) for t in tab.py))
    n = 600 * len(st.nodes)
    seen: set[int] = set()
    for node in st.nodes:
        for t in (node.grad_inputs or []) + (node.grad_outputs or []):
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            n += 120 + _tensor_bytes(t)
    return n


def _tensor_bytes(t: TensorTrace) -> int:
    return (t.thumb.nbytes if t.thumb is not None else 0) + (t.values.nbytes if t.values is not None else 0)


class ByteQueue:
    """A FIFO of steps bounded by their estimated bytes; the threads of the socket sink wait on it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: deque[tuple[Queued, int]] = deque()
        self.bytes = 0
        self.cond = threading.Condition()

    def offer(self, st: Queued, size: int, force: bool = False) -> bool:
        with self.cond:
            if not force and self.items and self.bytes + size > self.limit:
                return False
            self.items.append((st, size))
            self.bytes += size
            self.cond.notify_all()
            return True

    def take(self, timeout: float) -> Queued | None:
        with self.cond:
            if not self.items:
                self.cond.wait(timeout)
            if not self.items:
                return None
            st, size = self.items.popleft()
            self.bytes -= size
            self.cond.notify_all()
            return st

    def wait_empty(self, deadline: float) -> bool:
        with self.cond:
            while self.items and time.monotonic() < deadline:
                self.cond.wait(max(0.0, min(0.05, deadline - time.monotonic())))
            return not self.items

    def drain(self) -> list[Queued]:
        with self.cond:
            out = [st for st, _ in self.items]
            self.items.clear()
            self.bytes = 0
            return out
