"""The cyclic garbage collector, paused while a traced step is recorded and assembled.

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
"""

from __future__ import annotations

import gc


class CollectorPause:
    """Switches the cyclic garbage collector off (`pause`) and back on (`resume`) once, where it
    was on. Both are idempotent."""

    __slots__ = ("_paused",)

    def __init__(self) -> None:
        self._paused = False

    def pause(self) -> None:
        if not self._paused and gc.isenabled():
            gc.disable()
            self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            gc.enable()
