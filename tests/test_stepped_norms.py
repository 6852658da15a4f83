"""On a traced step, the norms of what an optimizer stepped with come from the summary kernel's statistics of
those gradients (NOTE [Stepped norms read from the summaries] in tracer/monitor/stepped.py). Checked against
the gradients the optimizer read (cloned by the test in its pre-hook): the total in float64 to 1e-7, a NaN or an
Inf in a gradient as torch's norm has it, the norm before clipping still bit for bit what `clip_grad_norm_`
returned, and the same numbers as an untraced step's fused norms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

import gradscape
from gradscape.tracer.record import native

pytestmark = pytest.mark.skipif(native.extension() is None, reason="the native recorder is not built")


def _model(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)


def _used(opt: torch.optim.Optimizer) -> tuple[list[torch.Tensor], object]:
    used: list[torch.Tensor] = []

    def pre(o: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        used[:] = [p.grad.detach().clone() for g in o.param_groups for p in g["params"] if p.grad is not None]

    return used, opt.register_step_pre_hook(pre)


def _float64_total(grads: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))


def _step(tr: gradscape.Tracer, i: int, model: nn.Module, opt: torch.optim.Optimizer, poison: float | None = None,
          clip: float | None = None) -> tuple[gradscape.StepTrace | None, float | None]:
    x = torch.randn(32, 6, dtype=next(model.parameters()).dtype)
    total = None
    with tr.step(i) as st:
        model(x).pow(2).mean().backward()
        if clip is not None:
            total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
        if poison is not None:
            next(model.parameters()).grad[0, 0] = poison
        opt.step()
        opt.zero_grad()
    return st, total


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_stepped_total_is_the_float64_norm_of_what_the_optimizer_read(dtype: torch.dtype) -> None:
    model = _model(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    used, handle = _used(opt)
    tr = gradscape.Tracer(model, every=1)
    for i in range(3):  # (the later steps carried)
        st, _ = _step(tr, i, model, opt)
        assert st is not None
        (rec,) = st.optimizer_steps
        want = _float64_total(used)
        assert rec.grad_norm == pytest.approx(want, rel=1e-7)
        assert rec.grad_norm != float(np.float32(rec.grad_norm))  # a float64 sum, not torch's float32 norm
        assert tr.history[-1]["grad_norm_clipped"] == pytest.approx(want, rel=1e-7)
    handle.remove()


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_a_nan_or_inf_in_a_stepped_gradient_is_the_norm_torch_gives(poison: float) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    used, handle = _used(opt)
    tr = gradscape.Tracer(model, every=1, triggers=False)
    st, _ = _step(tr, 0, model, opt, poison=poison)
    handle.remove()
    assert st is not None
    want = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in used])))
    got = st.optimizer_steps[0].grad_norm
    assert got is not None and (math.isnan(want) and math.isnan(got) or got == want == math.inf)


def test_clipped_traced_and_untraced_steps_agree() -> None:
    """The same two steps, traced and monitored only: the norm before clipping bit for bit `clip_grad_norm_`'s on
    both, the stepped norm the clip's bound on both, within float32's precision of each other."""
    rows = {}
    for every in (1, 10 ** 9):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        tr = gradscape.Tracer(model, every=every, norms_every=1)
        torch.manual_seed(1)
        got = []
        for i in range(2):
            _, total = _step(tr, i, model, opt, clip=0.05)
            row = tr.history[-1]
            assert total is not None and total > 0.05  # it clipped
            assert row["grad_norm"] == pytest.approx(total, rel=1e-6)
            (o,) = (tr.last.optimizer_steps if every == 1 and tr.last is not None else [None])
            if o is not None:
                assert o.grad_norm_before_clip == total  # bit for bit, as before
            got.append(row["grad_norm_clipped"])
        rows[every] = got
    assert rows[1] == pytest.approx(rows[10 ** 9], rel=1e-6)
    assert rows[1] == pytest.approx([0.05, 0.05], rel=1e-5)
