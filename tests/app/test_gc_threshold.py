"""The layout's garbage-collector setting: the collector stays on, and is put back as it was found."""

from __future__ import annotations

import gc
import threading
import weakref

from gradscape.tracer.collector import BURST_THRESHOLD, raised_gc_threshold


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_collector_stays_on_and_still_frees_cycles() -> None:
    before = gc.get_threshold()
    freed = threading.Event()
    with raised_gc_threshold():
        assert gc.isenabled()
        assert gc.get_threshold()[0] == max(BURST_THRESHOLD, before[0])
        node = _Node()
        weakref.finalize(node, freed.set)
        del node
        keep = [[i] for i in range(3 * BURST_THRESHOLD)]  # allocations enough for collections to run
        assert freed.is_set(), "no collection ran inside the block"
        del keep
    assert gc.isenabled() and gc.get_threshold() == before


def test_nested_and_threaded_entries_restore_once() -> None:
    before = gc.get_threshold()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(200):
                with raised_gc_threshold(), raised_gc_threshold():
                    assert gc.isenabled()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert gc.isenabled() and gc.get_threshold() == before


def test_a_disabled_collector_is_left_disabled() -> None:
    gc.disable()
    try:
        with raised_gc_threshold():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
