"""An empty gradient (transformers' attention concatenates its key and value onto an empty cache: `CatBackward0`
sends the cache a gradient of no elements) is summarised as the statistics of no elements and an empty picture,
with no torch op run for it; both recorders record such a step alike."""

from __future__ import annotations

import math

import pytest
import torch
from earlier_release import step_to_wire
from helpers import untimed
from torch import nn

import gradscape
from gradscape.tracer.record import native
from gradscape.tracer.summary.summariser import Summariser
from gradscape.tracer.wire import thumbnail_view

SHAPES = [((0,), torch.float32), ((2, 0, 3), torch.bfloat16), ((0, 5), torch.float64), ((4, 2, 0, 16), torch.float16)]


@pytest.mark.parametrize("thumb", [64, 0])
def test_an_empty_gradient_is_summarised_without_a_torch_op(thumb: int) -> None:
    summ = Summariser(thumb=thumb)
    tensors = [torch.zeros(shape, dtype=dtype) for shape, dtype in SHAPES]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        traces = [summ.summarise(t) for t in tensors]
    assert not [e.name for e in prof.events() if e.name.startswith("aten::")]
    summ.finalize()
    for (shape, dtype), tr in zip(SHAPES, traces):
        assert tr.shape == shape and tr.dtype == str(dtype).replace("torch.", "")
        assert tr.stats["norm"] == 0.0 and (tr.stats["nan"], tr.stats["inf"], tr.stats["zeros"]) == (0.0, 0.0, 0.0)
        assert all(math.isnan(tr.stats[k]) for k in ("min", "max", "mean", "std"))
        assert tr.thumb_view == thumbnail_view(shape)
        if thumb:
            assert tr.thumb is not None and tr.thumb.shape == (0, 0)
        else:
            assert tr.thumb is None
    assert summ.thumb_cells == 0 and not summ.nonfinite
    assert traces[0].stats is not traces[1].stats  # each its own dictionary


class _Cached(nn.Module):
    """Attention's cache, reduced: keys concatenated onto an empty cache made from the weight (no rows)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.key = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = self.key.weight[:0]  # (0, 8): the cache before the first token
        return torch.cat([cache, self.key(x)]).pow(2).mean()


def test_both_recorders_record_an_empty_gradient_alike() -> None:
    if not native.status()[0]:
        pytest.skip("no native recorder here")
    x = torch.randn(5, 8)
    wires = {}
    for recorder in ("native", "python"):
        model = _Cached()
        tr = gradscape.Tracer(model, recorder=recorder, monitor=False)
        with tr.step(0) as st:
            model(x).backward()
        assert st is not None and st.meta["recorder"] == recorder
        (cat,) = [n for n in st.nodes if n.name == "CatBackward0"]
        empty = cat.grad_inputs[0]
        assert empty is not None and empty.shape == (0, 8) and empty.stats["norm"] == 0.0
        wires[recorder] = untimed(step_to_wire(st))
        wires[recorder]["meta"].pop("recorder")
    for key in wires["python"]:
        assert wires["native"][key] == wires["python"][key], key
