"""NOTE [Collector paused] (tracer/collector.py): a step changes form (trace → wire → bytes → wire →
trace, and into and out of the trace file) without the cyclic garbage collector running, and the
collector is back as it was afterwards. The traced step's own pause is tested in test_side_effects.py."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from earlier_release import step_to_wire
from zoo import loop_model
from zoo import loop_step as zoo_loop_step

import gradscape
from gradscape import TraceStore
from gradscape.tracer.collector import CollectorPause, collector_paused
from gradscape.tracer.wire import pack, step_from_wire, unpack
from gradscape.tracer.wire.column_check import column_step
from gradscape.tracer.wire.column_write import step_message

_TRACER = str(Path(gradscape.tracer.__file__).resolve().parent)


@contextmanager
def calls_seen() -> Iterator[list[tuple[str, bool]]]:
    """(function, whether the collector was on) for every call into the tracer's code (tracer/collector.py
    aside) made on this thread while the block runs."""
    seen: list[tuple[str, bool]] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(_TRACER) and not code.co_filename.endswith("collector.py"):
            seen.append((code.co_name, gc.isenabled()))

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


@pytest.fixture(scope="module")
def loop_step() -> gradscape.StepTrace:
    """A traced step of an LSTMCell loop (about 2,000 nodes)."""
    torch.manual_seed(0)
    tr = gradscape.Tracer(loop_model())
    st = zoo_loop_step(tr, 0, 130)
    tr.close()
    assert st is not None and len(st.nodes) > 1500
    return st


def test_the_probe_sees_the_collector_on_where_nothing_pauses_it(loop_step: gradscape.StepTrace) -> None:
    """The control: a tracer function called outside any pause is seen with the collector on."""
    from gradscape.tracer.wire.codec import tensor_to_wire
    with calls_seen() as seen:
        tensor_to_wire(loop_step.nodes[0].grad_outputs[0])
    assert ("tensor_to_wire", True) in seen


def test_a_step_changes_form_with_the_collector_paused(loop_step: gradscape.StepTrace, tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.sqlite")
    conversions: list[tuple[str, Callable[[], Any]]] = [
        ("step_from_wire", lambda: step_from_wire(wire)),
        ("TraceStore.write_wire", lambda: store.write_wire(*checked)),
        ("TraceStore.write_step", lambda: store.write_step(loop_step)),
        ("TraceStore.read_graph", lambda: store.read_graph(loop_step.run, loop_step.step)),
        ("TraceStore.read_step", lambda: store.read_step(loop_step.run, loop_step.step)),
    ]
    with collector_paused():
        wire = unpack(pack(step_to_wire(loop_step)))  # an earlier tracer's maps
        checked = column_step(unpack(pack(step_message(loop_step))))  # what the server stores of this one's
    for name, convert in conversions:
        assert gc.isenabled()
        with calls_seen() as seen:
            convert()
        on = sorted({fn for fn, enabled in seen if enabled})
        assert seen and not on, f"{name}: the collector was on in {on}"
        assert gc.isenabled(), f"{name} left the collector off"
    back = store.read_step(loop_step.run, loop_step.step)
    assert len(back.nodes) == len(loop_step.nodes) and back.edges == loop_step.edges
    store.close()


def test_a_steps_nodes_read_in_a_loop_are_made_with_the_collector_paused(loop_step: gradscape.StepTrace,
                                                                         tmp_path: Path) -> None:
    """Reading every node of a step read back (a loop over `st.nodes`) makes the `NodeTrace`s not made yet
    with the collector paused; one node read alone is made as it is asked for."""
    with TraceStore(tmp_path / "t.sqlite") as store:
        store.write_step(loop_step)
        back = store.read_step(loop_step.run, loop_step.step)
    with calls_seen() as seen:
        back.nodes[3]
    assert ("_make", True) in seen
    with calls_seen() as seen:
        nodes = list(back.nodes)
    assert len(nodes) == len(loop_step.nodes) and nodes[3] is back.nodes[3]
    made = [enabled for fn, enabled in seen if fn == "_make"]
    assert len(made) >= len(nodes) - 1 and not any(made)
    assert gc.isenabled()


def test_pauses_nest_and_leave_a_collector_switched_off_by_the_program_off() -> None:
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause found it off
    assert gc.isenabled()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("in the block")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_pauses_keep_the_collector_off_until_the_last_ends() -> None:
    """The sink's thread converts step N while the training thread traces step N+1: a conversion that
    started first and ends during the traced step must not switch the collector back on in its middle."""
    started, step_began, conversion_ended = threading.Event(), threading.Event(), threading.Event()

    def convert() -> None:  # the sink's thread
        with collector_paused():
            started.set()
            step_began.wait(10)
        conversion_ended.set()

    sender = threading.Thread(target=convert)
    sender.start()
    assert started.wait(10) and not gc.isenabled()
    step = CollectorPause()  # the traced step's pause, started while the conversion runs
    step.pause()
    step_began.set()
    assert conversion_ended.wait(10)
    assert not gc.isenabled()  # the traced step is still running
    step.resume()
    step.resume()  # idempotent
    assert gc.isenabled()
    sender.join(10)
