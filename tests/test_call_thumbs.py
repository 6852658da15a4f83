"""A backward call that repeats an earlier one of its step gets coarser thumbnails (NOTE [Repeated calls'
thumbnails] in tracer/record/call_thumbs.py): each picture is checked against the thumbnail of the gradient
`torch.autograd.grad` gives, at the size its call should have; the first call, a call that repeats none and
the parameters' gradients keep the full size; both recorders give the same step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from earlier_release import step_to_wire
from helpers import untimed
from torch import nn

import gradscape
from gradscape.tracer.summary import bfloat16
from gradscape.tracer.summary.thumbnails import thumbnail

MICRO = 3


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(96, 80), nn.Tanh(), nn.Linear(80, 1))


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(100, 96, generator=g) for _ in range(MICRO)]


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).pow(2).mean() / MICRO


def _accumulated_step(recorder: str, **options: Any) -> tuple[Any, nn.Module, list[torch.Tensor]]:
    """One traced step of gradient accumulation over MICRO micro-batches and one SGD step."""
    model, xs = _mlp(), _batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tr = gradscape.Tracer(model, recorder=recorder, **options)
    with tr.step(0) as st:
        for x in xs:
            _loss(model, x).backward()
        opt.step()
    return st, model, xs


def _side(shape: tuple[int, ...], size: int) -> int:
    """The longest side of a thumbnail of `size` cells a side of a gradient of `shape`."""
    return max(thumbnail(torch.zeros(shape), size).shape)


def _same_picture(got: np.ndarray | None, grad: torch.Tensor, size: int) -> None:
    want = bfloat16.rounded(thumbnail(grad, size).numpy())  # as the arena keeps it (NOTE [Arena thumbnails])
    assert got is not None and got.shape == want.shape, (None if got is None else got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-7)


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_repeated_micro_batches_get_coarser_pictures_of_their_own_gradients(recorder: str) -> None:
    st, _, xs = _accumulated_step(recorder)
    ref = _mlp()
    assert st.meta["recorder"] == recorder
    node = st.param_node("0.weight")
    assert node is not None and [r.pass_index for r in node.runs] == list(range(MICRO))
    for k, (run, x) in enumerate(zip(node.runs, xs)):
        (want,) = torch.autograd.grad(_loss(ref, x), ref[0].weight)  # what arrived in micro-batch k
        got = run.grad_outputs[0]
        assert got is not None
        assert got.stats["norm"] == pytest.approx(float(want.norm()), rel=1e-5)  # statistics: the same
        _same_picture(got.thumb, want, 64 if k == 0 else 32)
    sides = {(r.pass_index, max(t.thumb.shape)) for n in st.nodes if n.kind != "param" for r in n.runs
             for t in r.grad_outputs if t is not None and t.thumb is not None and t.shape == (100, 80)}
    assert sides == {(0, _side((100, 80), 64)), (1, _side((100, 80), 32)), (2, _side((100, 80), 32))}


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_parameters_keep_the_full_size_and_module_calls_their_calls(recorder: str) -> None:
    st, _, _ = _accumulated_step(recorder)
    ref = _mlp()
    total = torch.autograd.grad(sum(_loss(ref, x) for x in _batches()), ref[0].weight)[0]
    _same_picture(st.params["0.weight"].thumb, total, 64)  # what SGD stepped with: every micro-batch's sum
    calls = st.modules["0"].calls
    assert len(calls) == MICRO
    for k, call in enumerate(calls):  # ∂L/∂(its output), 100×80: a slot of its micro-batch's nodes
        (g,) = call.grad_output
        assert g is not None and g.thumb is not None
        assert max(g.thumb.shape) == _side((100, 80), 64 if k == 0 else 32)


def test_both_recorders_record_the_same_accumulated_step() -> None:
    py, nat = (untimed(step_to_wire(_accumulated_step(r)[0])) for r in ("python", "native"))
    for d in (py, nat):
        d["meta"].pop("recorder")
    assert list(nat["params"]) == ["0.weight", "0.bias", "2.weight", "2.bias"]  # the model's order, both
    # what SGD stepped with: the native recorder's norm is the float64 sum of its summaries, the Python recorder's the
    # fused float32 norm (NOTE [Stepped norms read from the summaries] in tracer/monitor/stepped.py)
    (o_py,), (o_nat,) = py["optimizer_steps"], nat["optimizer_steps"]
    assert o_nat.pop("grad_norm") == pytest.approx(o_py.pop("grad_norm"), rel=1e-6)
    for key in py:
        assert nat[key] == py[key], f"the recorders differ in {key!r}"


def test_a_call_that_repeats_none_keeps_the_full_size() -> None:
    """A GAN's step: the discriminator on a real batch, on a fake one (a repeat), then the generator's pass
    through both (no repeat)."""
    torch.manual_seed(0)
    g_net, d_net = nn.Sequential(nn.Linear(8, 96), nn.Tanh()), nn.Sequential(nn.Linear(96, 80), nn.Tanh(),
                                                                              nn.Linear(80, 1))
    model = nn.ModuleDict({"G": g_net, "D": d_net})
    real, noise = torch.randn(100, 96), torch.randn(100, 8)
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        d_net(real).mean().backward()
        fake = g_net(noise)
        d_net(fake.detach()).mean().backward()
        d_net(fake).mean().neg().backward()
    node = st.param_node("D.0.weight")
    assert node is not None
    full, coarse = _side((80, 96), 64), _side((80, 96), 32)
    assert [max(r.grad_outputs[0].thumb.shape) for r in node.runs] == [full, coarse, full]
    g_node = st.param_node("G.0.weight")
    assert g_node is not None and len(g_node.runs) == 1
    assert g_node.runs[0].grad_outputs[0].thumb.shape == thumbnail(torch.zeros(96, 8), 64).shape


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_a_layer_of_the_same_shape_trained_next_is_no_repeat(recorder: str) -> None:
    """Forward-forward: two layers of one shape, each trained on a positive and a negative batch in turn. The
    second layer's first call has the first's shape but reaches new parameters: full size; each negative
    batch repeats its layer's positive one."""
    torch.manual_seed(0)
    layers = nn.ModuleList([nn.Linear(96, 80), nn.Linear(96, 80)])
    pos, neg = torch.randn(100, 96), torch.randn(100, 96)
    tr = gradscape.Tracer(layers, recorder=recorder)
    with tr.step(0) as st:
        for layer in layers:
            for x, sign in ((pos, -1.0), (neg, 1.0)):
                (sign * torch.relu(layer(x)).pow(2).mean()).backward()
    full, coarse = _side((80, 96), 64), _side((80, 96), 32)
    for name in ("0.weight", "1.weight"):
        node = st.param_node(name)
        assert node is not None
        assert [max(r.grad_outputs[0].thumb.shape) for r in node.runs] == [full, coarse], name


@pytest.mark.parametrize("thumb, sizes", [((64, 64), (64, 64)), ((16, 8), (16, 8)), (20, (20, 10))])
def test_thumb_sets_both_sizes(thumb: Any, sizes: tuple[int, int]) -> None:
    st, _, _ = _accumulated_step("native", thumb=thumb)
    node = st.param_node("0.weight")
    assert node is not None
    got = [max(r.grad_outputs[0].thumb.shape) for r in node.runs]
    assert got == [_side((80, 96), sizes[0]), _side((80, 96), sizes[1]), _side((80, 96), sizes[1])]


@pytest.mark.parametrize("thumb", [-1, (64,), (64, -2), 64.0, (64, 32, 16), "64", (64, True)])
def test_a_bad_thumb_is_named(thumb: Any) -> None:
    with pytest.raises(ValueError, match=r"thumb must be a non-negative int or a pair"):
        gradscape.Tracer(nn.Linear(2, 2), thumb=thumb)


class _Swish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)  # x used by two ops: its gradient through the module is their sum


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_a_module_sum_keeps_the_full_size_in_every_call(recorder: str) -> None:
    """A module input two ops used: its gradient through each call is a sum summarised at the step's end, at the
    first size, and the sum of what `torch.autograd.grad` gives through both ops."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(96, 80), _Swish(), nn.Linear(80, 1))
    xs = _batches()
    tr = gradscape.Tracer(model, recorder=recorder)
    with tr.step(0) as st:
        for x in xs:
            _loss(model, x).backward()
    calls = st.modules["1"].calls
    assert len(calls) == MICRO
    for x, call in zip(xs, calls):
        h = model[0](x)
        loss = model[2](model[1](h)).pow(2).mean() / MICRO  # `_loss`, from the Swish's input on
        (want,) = torch.autograd.grad(loss, h)  # ∂L/∂(the Swish's input), both ops' parts summed
        (got,) = call.grad_input
        assert got is not None and got.stats["norm"] == pytest.approx(float(want.norm()), rel=1e-5)
        _same_picture(got.thumb, want, 64)
