"""On a traced step, the norms the monitor takes after a backward are read from the native recorder's summaries of
what arrived at each parameter, where `.grad` is that very arrival, unchanged (NOTE [Norms after a backward from the
arrivals] in tracer/monitor/arrival_norms.py). Checked against each `.grad` as the test cloned it right after the
backward: within 1e-6 of the exact norm and none of them a float32 (torch's norms of float32 gradients all are)
where the summaries give them, and torch's own fused norms, bit for bit, where they cannot (accumulated, changed in
place, a NaN) and before a clip."""

from __future__ import annotations

import math
import warnings
import weakref

import numpy as np
import pytest
import torch
import torch.nn as nn

import gradscape
from gradscape.tracer.monitor import grad_norms
from gradscape.tracer.record import native

pytestmark = pytest.mark.skipif(native.extension() is None, reason="the native recorder is not built")


@pytest.fixture(autouse=True)
def _past_native_norms(monkeypatch: pytest.MonkeyPatch) -> None:
    """These gradients as a model's too large for the extension's own norms (NOTE [Native norms] in
    tracer/monitor/grad_norms.py), which small CPU gradients take first: the arrivals' summaries, then torch's."""
    monkeypatch.setattr(grad_norms, "NATIVE_MOST", 0)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _traced(lr: float = 0.01, **opts: object) -> tuple[nn.Module, torch.optim.Optimizer, gradscape.Tracer]:
    """The MLP, its SGD and a Tracer of it (every step traced unless `opts` say otherwise; no triggers)."""
    model = _model()
    tr = gradscape.Tracer(model, **{"every": 1, "triggers": False, **opts})
    return model, torch.optim.SGD(model.parameters(), lr=lr), tr


def _float64_norm(g: torch.Tensor) -> float:
    return math.sqrt(float(g.double().pow(2).sum()))


def _torch_norms(grads: list[torch.Tensor]) -> list[float]:
    return [float(v) for v in torch._foreach_norm(grads)]  # the monitor's fused call


def _row_norms(tr: gradscape.Tracer, model: nn.Module) -> list[float]:
    row = tr.history[-1]
    assert row["norms"] is True
    by_name = row["param_norms"]
    return [by_name[name] for name, _ in model.named_parameters()]


def _read_from_summaries(norms: list[float], left: list[torch.Tensor]) -> None:
    """`norms` are the summaries' (float64 sums, within 1e-6 of the exact norm), not torch's float32 norms."""
    assert norms == pytest.approx([_float64_norm(g) for g in left], rel=1e-6)
    assert all(v != float(np.float32(v)) for v in norms)  # none is a float32: torch's would all be


def _backward(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """One backward; each `.grad` as it left them, cloned."""
    model(x).pow(2).mean().backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def test_a_single_backward_reads_its_norms_from_the_arrivals() -> None:
    model, opt, tr = _traced()
    for i in range(3):  # (the later steps carried)
        with tr.step(i) as st:
            opt.zero_grad()
            left = _backward(model, torch.randn(32, 6))
            opt.step()
        assert st is not None and st.meta["recorder"] == "native"
        _read_from_summaries(_row_norms(tr, model), left)
        (rec,) = st.optimizer_steps
        total = math.sqrt(math.fsum(_float64_norm(g) ** 2 for g in left))
        assert rec.grad_norm_before_clip == pytest.approx(total, rel=1e-6)
        assert rec.grad_norm_before_clip != float(np.float32(rec.grad_norm_before_clip))
        assert tr.history[-1]["grad_norm"] == pytest.approx(total, rel=1e-6)


def test_the_python_recorder_takes_torchs_norms() -> None:
    model, opt, tr = _traced(recorder="python")
    with tr.step(0) as st:
        opt.zero_grad()
        left = _backward(model, torch.randn(32, 6))
        opt.step()
    assert st is not None and st.meta["recorder"] == "python"
    assert _row_norms(tr, model) == _torch_norms(left)


def test_a_clip_still_sees_its_own_total_bit_for_bit() -> None:
    model, opt, tr = _traced()
    for i in range(3):  # step 0 reads the arrivals and takes them again at the clip; later steps, torch's at once
        with tr.step(i) as st:
            opt.zero_grad()
            left = _backward(model, torch.randn(32, 6) * 10)
            total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1))
            opt.step()
        assert st is not None
        (rec,) = st.optimizer_steps
        assert total > 0.1  # the loop did clip
        assert rec.grad_norm_before_clip == total  # bit for bit: clip_grad_norm_'s own computation
        assert _row_norms(tr, model) == _torch_norms(left)


def test_accumulated_gradients_take_torchs_norms() -> None:
    model, opt, tr = _traced()
    for i in range(2):
        with tr.step(i):
            opt.zero_grad()
            _backward(model, torch.randn(32, 6))
            left = _backward(model, torch.randn(32, 6))  # added to the first: no longer an arrival
            opt.step()
        assert _row_norms(tr, model) == _torch_norms(left)


@pytest.mark.parametrize("changed", [False, True])
def test_an_earlier_calls_arrival_is_read_unless_changed_in_place(changed: bool) -> None:
    """Two layers' losses backward one after the other, one optimizer step: the second call's snapshot holds the
    first layer's gradients too, read from their arrival unless the loop changed them in place since."""
    torch.manual_seed(0)
    layers = nn.ModuleList([nn.Linear(6, 8), nn.Linear(6, 8)])
    opt = torch.optim.SGD(layers.parameters(), lr=0.01)
    tr = gradscape.Tracer(layers, every=1, triggers=False)
    x = torch.randn(4, 6)
    for i in range(3):
        with tr.step(i):
            opt.zero_grad()
            for k, layer in enumerate(layers):
                layer(x).pow(2).mean().backward()
                if changed and k == 0:
                    layer.weight.grad.mul_(2)  # moves its version
            left = [p.grad.detach().clone() for p in layers.parameters()]
            opt.step()
        norms = _row_norms(tr, layers)
        if changed:  # the second call's snapshot is torch's, of the doubled gradient
            assert norms == _torch_norms(left)
        else:
            _read_from_summaries(norms, left)


def test_a_nan_in_an_arrival_is_torchs_nan() -> None:
    model, opt, tr = _traced(0.0)
    x = torch.randn(32, 6)
    x[0, 0] = float("nan")
    with tr.step(0):
        opt.zero_grad()
        left = _backward(model, x)
        opt.step()
    norms = _row_norms(tr, model)
    assert np.isnan(norms[0])  # the kernel's sums leave the NaN out: torch's norm has it
    assert np.array_equal(norms, _torch_norms(left), equal_nan=True)


def test_reading_the_loss_warns_nothing() -> None:
    """The monitor reads a CPU loss that needs grad at once (`float()` of one warns; the monitor's read must not)."""
    model, opt, tr = _traced(every=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(4):  # traced and monitored steps
            with tr.step(i):
                opt.zero_grad()
                loss = model(torch.randn(32, 6)).pow(2).mean()
                loss.backward()
                opt.step()
            assert tr.history[-1]["loss"] == float(loss.detach())


def test_a_snapshot_read_from_summaries_holds_no_gradient() -> None:
    """What the clip's re-take needs is held weakly: a gradient `zero_grad()` lets go of inside the block is freed."""
    model, opt, tr = _traced()
    for i in range(2):
        with tr.step(i):
            opt.zero_grad()
            _backward(model, torch.randn(32, 6))
            opt.step()
            held = [weakref.ref(p.grad) for p in model.parameters()]
            opt.zero_grad()  # (set to None)
            assert all(r() is None for r in held)
