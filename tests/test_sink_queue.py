"""The socket sink's queue bound (tracer/sinks/queue.py): a step's size is estimated without making its
nodes, close to what is sent, and the queue holds steps up to its bound in bytes."""

from __future__ import annotations

import pytest
from test_native_recorder import _program

import gradscape
from gradscape.tracer.record import native
from gradscape.tracer.sinks.queue import ByteQueue, estimate_bytes
from gradscape.tracer.wire import pack
from gradscape.tracer.wire.column_write import step_message


@pytest.mark.parametrize("recorder", ["native", "python"])
@pytest.mark.parametrize("name", ["cnn", "transformer", "module_calls"])
def test_a_steps_estimate_is_near_its_sent_size(name: str, recorder: str) -> None:
    if recorder == "native" and not native.status()[0]:
        pytest.skip("the native recorder is not built")
    model, loss_of = _program(name)
    tr = gradscape.Tracer(model, recorder=recorder)
    with tr.step(0) as st:
        loss_of(model).backward()
    assert st.meta.get("recorder", "python") == recorder, st.meta
    size = estimate_bytes(st)
    if recorder == "native":
        assert all(n is None for n in st.nodes._made), "the estimate made the step's nodes"
    sent = len(pack(step_message(st)))
    assert sent / 2 <= size <= sent * 3, (size, sent)


def test_the_queue_holds_steps_up_to_its_bound() -> None:
    q = ByteQueue(100)
    assert q.offer("a", 500)  # an empty queue takes any one step, however large
    assert not q.offer("b", 1)
    assert q.take(0.0) == "a" and q.bytes == 0
    assert q.offer("c", 60) and q.offer("d", 40) and not q.offer("e", 1)
    assert q.offer("f", 1, force=True)  # a forced offer (a step to spill) is never refused
    assert [q.take(0.0) for _ in range(4)] == ["c", "d", "f", None]

