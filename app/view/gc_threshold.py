"""Fewer garbage-collector passes during a burst of allocations, without turning the collector off.

Laying out a 10,000-node step allocates ~100k small lists and dicts that all live until the function
returns. With the default thresholds each 700 allocations start a young collection, and the survivors
soon trigger full collections that re-traverse every object alive in the process (the step's wire form
included) and free nothing: 2-3× the layout's own time. While a layout runs, the first-generation
threshold is raised to `BURST_THRESHOLD`: collections still run (the collector stays enabled for the
whole process, a training loop in it included), one per that many allocations instead of one per 700.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

BURST_THRESHOLD = 50_000

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def raised_gc_threshold() -> Iterator[None]:
    """Nestable and thread-safe: the first entry raises the threshold (if it is lower), the last exit
    puts back the thresholds it found. Never disables the collector."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            if 0 < _saved[0] < BURST_THRESHOLD:
                gc.set_threshold(BURST_THRESHOLD, _saved[1], _saved[2])
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                if gc.get_threshold()[0] == BURST_THRESHOLD:  # nobody changed it meanwhile
                    gc.set_threshold(*_saved)
                _saved = None
