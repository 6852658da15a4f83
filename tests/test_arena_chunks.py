"""The summary arena's chunks (NOTE [Arena chunks] in tracer/record/csrc/chunks.h): a chunk's memory goes back
to a pool when the last view of it goes, later steps reuse it, and a step that is still held keeps its own
summaries whatever the steps after it write."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import gradscape
from gradscape.tracer.record import native


@pytest.fixture
def ext() -> Any:
    used, why = native.status()
    if not used:
        pytest.skip(f"the native recorder is not in use: {why}")
    return native._loaded()[0]


def _chunk_addresses(st: Any) -> list[int]:
    return [int(c.ctypes.data) for c in st.nodes.tables.tensors.chunks]


def test_a_held_step_keeps_its_gradients_while_later_steps_reuse_the_arena(ext: Any) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    tr = gradscape.Tracer(model, every=1, keep=1, monitor=False)
    xs = [torch.randn(5, 4) for _ in range(8)]

    def loss(x: torch.Tensor) -> torch.Tensor:
        return model(x).pow(2).sum()

    # chunks of a step's first size already waiting, as earlier steps of the process leave them
    spare = [ext.chunk(1 << 18) for _ in range(4)]
    del spare
    # what the engine computes for step 0, apart from the tracer
    expected = torch.autograd.grad(loss(xs[0]), list(model.parameters()))
    with tr.step(0) as held:
        loss(xs[0]).backward()
    model.zero_grad()
    assert held is not None
    first = _chunk_addresses(held)

    addresses = []
    for i in range(1, len(xs)):  # each step's trace is dropped by the next: its chunks go to the pool
        with tr.step(i) as st:
            loss(xs[i]).backward()
        model.zero_grad()
        addresses.append(_chunk_addresses(st))
        del st
    assert ext.pool()[0] >= 1, "no chunk went back to the pool"
    # steps 1, 3, 5, ... and 2, 4, 6, ... took turns with the same memory, and none took step 0's
    assert addresses[2] == addresses[0] and addresses[3] == addresses[1], addresses
    assert not set(first) & {a for step in addresses for a in step}

    # step 0's trace, first read now, after seven steps wrote their arenas: the engine's gradients
    for (name, _), want in zip(model.named_parameters(), expected):
        got = held.params[name]
        assert got.thumb is not None and got.thumb.size == want.numel()  # small: the thumbnail is the gradient
        np.testing.assert_array_equal(got.thumb, want.reshape(got.thumb.shape).numpy())
        node = held.param_node(name)
        assert node is not None and node.grad_outputs is not None and node.grad_outputs[0] is not None
        np.testing.assert_array_equal(node.grad_outputs[0].thumb, got.thumb)
    tr.close()


def test_the_pool_holds_at_most_its_cap(ext: Any) -> None:
    chunks = [ext.chunk(4 << 20) for _ in range(24)]  # 96 MB mapped, never touched
    for c in chunks:
        memoryview(c)[0] = 1  # writable
    del chunks, c
    # 96 MB offered: the pool takes chunks until the next would pass 64 MB, and unmaps the rest
    _waiting, nbytes = ext.pool()
    assert (64 << 20) - (4 << 20) < nbytes <= 64 << 20


def test_a_chunk_of_no_bytes_is_refused_by_name(ext: Any) -> None:
    with pytest.raises(ValueError, match="nbytes must be positive, got 0"):
        ext.chunk(0)
