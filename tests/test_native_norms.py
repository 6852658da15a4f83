"""The monitor's norms of small CPU gradients from the extension (NOTE [Native norms] in tracer/monitor/grad_norms.py):
each within 1e-6 of the exact norm (float64 sums) for every dtype the kernel reads, NaN and inf as torch's norms give
them, declined (None) for what it does not take; and in a monitored loop the history's norms are the gradients',
while `grad_norm_before_clip` stays what `clip_grad_norm_` returned, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

import gradscape
from gradscape.tracer.monitor import grad_norms
from gradscape.tracer.monitor.grad_norms import NATIVE_MOST, native_norms
from gradscape.tracer.record import native

pytestmark = pytest.mark.skipif(native.extension() is None, reason="the native recorder is not built")


def _exact(g: torch.Tensor) -> float:
    return math.sqrt(float(g.double().pow(2).sum()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_each_norm_is_the_gradients_own(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    grads = [(torch.randn(*shape, generator=gen) * scale).to(dtype)
             for shape, scale in [((128, 64), 1e-3), ((128,), 1.0), ((3, 4, 5, 6), 30.0), ((0,), 1.0), ((1,), 1e-20)]]
    got = native_norms(grads)
    assert got is not None and len(got) == len(grads)
    assert got == pytest.approx([_exact(g) for g in grads], rel=1e-6)
    assert all(type(v) is float for v in got)


def test_nan_and_inf_as_torchs_norms_give_them() -> None:
    grads = [torch.tensor([1.0, float("nan")]), torch.tensor([float("inf"), 2.0]),
             torch.tensor([float("-inf"), float("nan")]), torch.tensor([3.0, 4.0])]
    got = native_norms(grads)
    want = [float(v) for v in torch._foreach_norm(grads)]
    assert got is not None
    assert math.isnan(got[0]) and math.isnan(want[0])
    assert got[1] == want[1] == math.inf
    assert math.isnan(got[2]) and math.isnan(want[2])
    assert got[3] == 5.0


class _Wrapped(torch.Tensor):
    """A tensor subclass without storage of its own that dispatches to Python (as a DTensor shard does)."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> _Wrapped:
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func: object, types: object, args: object = (), kwargs: object = None) -> object:
        raise NotImplementedError(f"{func} on a wrapped tensor")


def test_a_dense_gradient_is_read_in_any_order_of_its_dimensions() -> None:
    g = torch.randn(4, 6, 5, 3)
    dense = [torch.randn(6, 5).t(), g.to(memory_format=torch.channels_last), g.permute(3, 1, 0, 2)]
    assert not any(t.is_contiguous() for t in dense)
    got = native_norms(dense)
    assert got == pytest.approx([_exact(t) for t in dense], rel=1e-6)


@pytest.mark.parametrize("what", ["strided", "integer", "sparse", "too many", "not a tensor", "subclass", "meta"])
def test_what_it_does_not_take_is_left_to_torch(what: str) -> None:
    small = torch.randn(8, 8)
    other = {"strided": small[:, :4], "integer": torch.arange(4), "sparse": small.to_sparse(),
             "too many": torch.zeros(NATIVE_MOST), "not a tensor": 1.0, "subclass": _Wrapped(small),
             "meta": torch.empty(8, device="meta")}[what]
    assert native_norms([small]) is not None
    assert native_norms([small, other]) is None  # (none of them read: one call, all or nothing)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


@pytest.mark.parametrize("every", [10 ** 9, 1])  # monitored steps, every one with norms; every step traced
def test_a_monitored_loop_reads_the_extensions_norms_and_a_clip_its_own(every: int) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gradscape.Tracer(model, every=every, norms_every=1, triggers=False) as tr:
        for i in range(4):
            with tr.step(i) as st:
                opt.zero_grad()
                model(torch.randn(32, 6) * (10 if i >= 2 else 1)).pow(2).mean().backward()
                left = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
                total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)) if i >= 2 else None
                opt.step()
            row = tr.history[-1]
            assert row["param_norms"] == pytest.approx({n: _exact(g) for n, g in left.items()}, rel=1e-6)
            if total is None:  # not taken again: the extension's float64 norms, none of them a float32
                assert all(v != float(np.float32(v)) for v in row["param_norms"].values())
            else:  # a clip: the snapshot taken again with torch's call, whose total the clip returned
                torchs = torch._foreach_norm(list(left.values()))
                assert row["param_norms"] == {n: float(v) for n, v in zip(left, torchs)}
                if st is not None:  # (a traced step's optimizer steps)
                    assert st.optimizer_steps[0].grad_norm_before_clip == total  # bit for bit
                assert row["grad_norm_clipped"] == pytest.approx(0.1, rel=1e-5)


def test_past_what_it_takes_the_norms_are_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grad_norms, "NATIVE_MOST", 100)  # (this MLP has 163 elements of gradient)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gradscape.Tracer(model, every=10 ** 9, norms_every=1, triggers=False) as tr:
        for i in range(2):  # (step 0 is traced: its norms come from the arrivals' summaries)
            with tr.step(i):
                opt.zero_grad()
                model(torch.randn(32, 6)).pow(2).mean().backward()
                left = [p.grad.detach().clone() for p in model.parameters()]
                opt.step()
    assert tr.history[-1]["step"] == 1 and tr.history[-1]["traced"] is False
    by_name = tr.history[-1]["param_norms"]
    assert list(by_name.values()) == [float(v) for v in torch._foreach_norm(left)]


@pytest.mark.parametrize("every", [10 ** 9, 1])  # monitored steps with norms; every step traced
def test_norms_that_cannot_be_taken_leave_the_backward_and_the_loop_alone(every: int,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A parameter whose `.grad` no norm can be taken of (set by hand to a tensor that dispatches to Python and
    raises): the monitor's norms after the backward fail, the backward returns, the loop's update is made, and each
    step still has its row; the failure is logged."""
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    model.register_parameter("unused", nn.Parameter(torch.zeros(4)))
    used = [p for n, p in model.named_parameters() if n != "unused"]
    opt = torch.optim.SGD(used, lr=0.01)
    with caplog.at_level("WARNING", logger="gradscape"), \
            gradscape.Tracer(model, every=every, norms_every=1, triggers=False) as tr:
        for i in range(3):
            with tr.step(i):
                opt.zero_grad()
                model.unused.grad = _Wrapped(torch.zeros(4))
                before = model[0].weight.detach().clone()
                model(torch.randn(8, 6)).pow(2).mean().backward()
                grad = model[0].weight.grad.detach().clone()
                opt.step()
            assert torch.equal(model[0].weight.detach(), before.add(grad, alpha=-0.01))  # as SGD makes it
        assert [row["step"] for row in tr.history] == [0, 1, 2]
    assert any("could not take the gradients' norms" in r.getMessage() for r in caplog.records)
