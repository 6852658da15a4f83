"""Pause Python's cyclic garbage collector around a burst of allocations.

Laying out a 10,000-node step allocates ~100k small lists and dicts that all live until the
function returns. Each allocation burst triggers full collections that re-traverse every object
alive in the process, the step's wire form included (~200k objects), and find nothing to free:
measured 40-50% of the layout time. Reference counting still frees everything as usual; only
the search for reference cycles waits until the outermost pause ends.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Nestable and thread-safe: the first entry disables the collector, the last exit restores
    the state it found (so a caller that had disabled it keeps it disabled)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
