"""The cyclic garbage collector, paused while a traced step is recorded and emitted (`CollectorPause`), and
while a step changes form (`collector_paused`), its threshold raised while the page lays a graph out
(`raised_gc_threshold`), and the freeze of what the page's server keeps (`made_frozen`). The collector is
one per process; this module is the one place that sets its policy.

NOTE [Garbage collector]
    Recording a step makes a few Python objects per autograd node (its record, its hook, its runs,
    its summaries, its `NodeTrace`), and most of them live until the step is emitted. CPython runs a
    young collection every 700 net allocations and a full one every hundred young ones once the old
    generation has grown by a quarter, which a step of 10k nodes does: left on, the collector ran
    several full collections per traced step, each re-scanning every object alive (the steps a
    memory sink keeps among them), and took 60-70% of the traced step's time on the LSTMCell loop of
    bench/pernode.py. None of those objects is garbage before the step ends, so those collections
    found nothing.

    The forward of a traced step keeps objects alive too (each module call's record and the graph
    nodes it names), and left on in the forward the collector's full collections made the cost per
    node grow with the graph: 11 µs a node at 10k nodes of the LSTMCell loop, 23 µs at 50k; paused
    from the step's start, 11 µs at both (bench/pernode.py, one process, the same machine).

    So from the start of a traced step until the step has been handed to its sinks, the collector is
    off (`gc.disable()`), and it is switched back on afterwards, also when the step raises. Only when
    it was on: a program that switched it off itself keeps it off. Nothing is freed later than it
    would have been by reference counting; only cyclic garbage made meanwhile (in the user's
    forward too) waits for the next collection after the step. Untraced steps are left alone.

NOTE [Collector paused]
    Turning a big step from one form into another outside a traced step (the socket sink's thread
    encoding a step it took from its queue, the server checking a step it received and storing it,
    `gradscape.load`, the HTML export) makes millions of small containers that form no cycles and live
    until the conversion ends. With the collector on, they set off full collections that traverse
    every object alive in the process, the step's other forms included, and free nothing: in a process
    holding a traced 100,002-node step of the LSTMCell loop, writing its maps (the form earlier
    releases wrote) took 7.1 s with the collector on and 2.3 s with it paused, and storing them 8.4 s
    and 5.1 s; a 15k-node
    step read back from the trace file, 6.3 s and 2.5 s. So these conversions run inside
    `collector_paused()`.

    Paused in the socket sink's thread, the collector is paused for the training thread too, for as
    long as that conversion takes (seconds at 100k nodes, well under a millisecond for a small step).
    Reference counting still frees everything at once; only cyclic garbage waits for the collector's
    return.

    Pauses overlap: the socket sink's thread converts step N while the training thread traces step N+1, and
    the pause of each may end first. So the pauses are counted, process-wide: the first to start
    notes whether the collector was on and switches it off, and the last to end switches it back on
    if it was. (Had each pause put back what it found, a conversion that started before a traced
    step and ended during it would switch the collector back on in the middle of that step.) A
    program that switched the collector off itself keeps it off.

NOTE [Kept frozen]
    The page's server keeps the decoded graphs of the steps it shows (`PageData`): a 100,002-node step
    of the LSTMCell loop decodes to 2.3 million containers (2.0 million of them lists) that live as
    long as the page shows the step. Paused or not, the collector traverses each of them at least
    three times (the young collection after the pause, then the middle and the old generation's), and
    every full collection after that again: 1.1-1.6 s each time for one 100k-node step, in the
    server's threads that answer the page, freeing nothing (the decoded graph is a tree of dicts and
    lists, with no cycle). `made_frozen` decodes with the collector paused and then freezes
    (`gc.freeze()`): everything alive is moved to the permanent generation, which no collection
    traverses. Reference counting still frees it when the page lets the graph go (tested: graphs
    decoded one after another do not add up in `gc.get_freeze_count()`). The page reads a stored step
    lazily since (`tracer/wire/lazy.py`): what it keeps is the step's document and the maps it read, and
    reading every node at once (a search) decodes them through `made_frozen` as well (`decode_all_with`).

    Freezing is process-wide. Anything alive at that moment that later becomes cyclic garbage is not
    freed. So it is done just after a full collection (before the decode; with earlier graphs frozen,
    it traverses only what is new since), and only in a process whose heap is gradscape's own:
    `gradscape serve` (`ServerConfig.freeze_graphs`). The server started inside a notebook or a
    training script does not freeze, since there the user's own objects (a model dropped later, with
    its tensors) would be frozen with it.

NOTE [Raised threshold]
    Laying out a 10,000-node step (app/view/layout.py) allocates ~100k small lists and dicts that all live
    until the function returns. With the default thresholds each 700 allocations start a young
    collection, and the survivors soon trigger full collections that re-traverse every object alive in
    the process (the step's wire form included) and free nothing: 2-3x the layout's own time. While a
    layout runs, the first-generation threshold is raised to `BURST_THRESHOLD`: collections still run
    (the collector stays enabled for the whole process, a training loop in it included), one per that
    many allocations instead of one per 700.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_depth = 0  # pauses running now, in every thread
_was_on = False  # whether the collector was on when the first of them started


def _pause() -> None:
    global _depth, _was_on
    with _lock:
        if _depth == 0:
            _was_on = gc.isenabled()
            gc.disable()
        _depth += 1


def _resume() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0 and _was_on:
            gc.enable()


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off for the block (NOTE [Collector paused]); also a decorator."""
    _pause()
    try:
        yield
    finally:
        _resume()


class CollectorPause:
    """One pause (NOTE [Collector paused]) started by `pause` and ended by `resume`, once each: both are
    idempotent."""

    __slots__ = ("_paused",)

    def __init__(self) -> None:
        self._paused = False

    def pause(self) -> None:
        if not self._paused:
            _pause()
            self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            _resume()


BURST_THRESHOLD = 50_000
_threshold_depth = 0  # raised thresholds running now, in every thread
_saved: tuple[int, int, int] | None = None  # the thresholds the first of them found


@contextmanager
def raised_gc_threshold() -> Iterator[None]:
    """NOTE [Raised threshold]. Nestable and thread-safe: the first entry raises the threshold (if it is
    lower), the last exit puts back the thresholds it found. Never disables the collector."""
    global _threshold_depth, _saved
    with _lock:
        if _threshold_depth == 0:
            _saved = gc.get_threshold()
            if 0 < _saved[0] < BURST_THRESHOLD:
                gc.set_threshold(BURST_THRESHOLD, _saved[1], _saved[2])
        _threshold_depth += 1
    try:
        yield
    finally:
        with _lock:
            _threshold_depth -= 1
            if _threshold_depth == 0 and _saved is not None:
                if gc.get_threshold()[0] == BURST_THRESHOLD:  # nobody changed it meanwhile
                    gc.set_threshold(*_saved)
                _saved = None


def made_frozen(make: Callable[[], T]) -> T:
    """`make()`, after a full collection and with the collector paused, then everything alive frozen (NOTE
    [Kept frozen]): for a large, acyclic value kept for long, in a process whose heap is gradscape's."""
    gc.collect()
    with collector_paused():
        value = make()
        gc.freeze()
    return value
