"""What a loop's update used, when it is not (only) an optimizer's: `clip_grad_norm_` then a hand-written
`p.data.add_(p.grad, alpha=-lr)` (the word-language-model example), `clip_grad_value_`, and one optimizer
stepping twice in one block (layer-local training). Checked against `torch.autograd.grad` on the same
loss, and against the gradients the update itself read (cloned by the test at the update)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.nn.utils import clip_grad_norm_  # taken by name before any block opens (NOTE [Clipping seen])

import gradscape


class _TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.rnn = nn.LSTM(8, 12)
        self.out = nn.Linear(12, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.emb(x))[0])


def _lm_batch() -> tuple[_TinyLM, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return _TinyLM(), torch.randint(0, 20, (7, 4)), torch.randint(0, 20, (7, 4))


def _loss(model: _TinyLM, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x).view(-1, 20), y.view(-1))


def _expected_clipped(model: _TinyLM, x: torch.Tensor, y: torch.Tensor, max_norm: float) -> dict[str, torch.Tensor]:
    """The clipped gradients from `torch.autograd.grad`, scaled as `clip_grad_norm_` documents it."""
    names, params = zip(*model.named_parameters())
    grads = torch.autograd.grad(_loss(model, x, y), params)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    return {n: g * coef for n, g in zip(names, grads)}


@pytest.mark.parametrize("tensors", ["full", "summary"])
def test_a_clipped_update_by_hand_is_what_st_params_holds(tensors: str) -> None:
    model, x, y = _lm_batch()
    want = _expected_clipped(model, x, y, 0.05)
    tr = gradscape.Tracer(model, tensors=tensors)
    with tr.step(0) as st:
        model.zero_grad()
        _loss(model, x, y).backward()
        total = clip_grad_norm_(model.parameters(), 0.05)
        used = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-20.0)
    assert st is not None and float(total) > 0.2  # it did clip, by far
    assert set(st.params) == set(used)
    for name, g in used.items():
        t = st.params[name]
        assert t.stats["norm"] == pytest.approx(float(torch.linalg.vector_norm(g.double())), rel=1e-5), name
        assert torch.allclose(g, want[name], rtol=1e-4, atol=1e-7), name
        if tensors == "full":
            assert np.array_equal(t.values, g.numpy()), name
    row = tr.history[-1]
    clipped = math.sqrt(sum(float(g.double().pow(2).sum()) for g in used.values()))
    assert row["grad_norm"] == pytest.approx(float(total), rel=1e-6)
    assert row["grad_norm_clipped"] == pytest.approx(clipped, rel=1e-6)
    assert row["grad_norm_clipped"] == pytest.approx(0.05, rel=1e-4)


def test_an_untraced_step_fills_the_clipped_norm_for_clip_grad_value() -> None:
    model, x, y = _lm_batch()
    tr = gradscape.Tracer(model, every=10 ** 9)
    for i in range(2):
        with tr.step(i) as st:
            model.zero_grad()
            _loss(model, x, y).backward()
            arrived = [p.grad.detach().clone() for p in model.parameters()]
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)
            used = [p.grad.detach().clone() for p in model.parameters()]
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
    assert st is None
    assert any(not torch.equal(a, u) for a, u in zip(arrived, used))  # it did clamp
    row = tr.history[-1]
    assert row["grad_norm_clipped"] == pytest.approx(
        math.sqrt(sum(float(g.double().pow(2).sum()) for g in used)), rel=1e-6)
    assert row["grad_norm"] == pytest.approx(math.sqrt(sum(float(g.double().pow(2).sum()) for g in arrived)), rel=1e-6)


def test_an_optimizer_stepping_with_a_clip_keeps_what_it_stepped_with() -> None:
    """The optimizer's record wins over the clip it followed, and they agree: the clip came first."""
    model, x, y = _lm_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    tr = gradscape.Tracer(model, tensors="full")
    with tr.step(0) as st:
        _loss(model, x, y).backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)
        used = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    assert st is not None
    for name, g in used.items():
        assert np.array_equal(st.params[name].values, g.numpy()), name
        assert np.array_equal(st.optimizer_steps[0].grads[name].values, g.numpy()), name


@pytest.mark.parametrize("tensors", ["full", "summary"])
def test_one_optimizer_stepping_twice_keeps_each_steps_gradients(tensors: str) -> None:
    """Layer-local training with one optimizer: each `OptimizerStep.grads` is what that step used (read in the
    test's own post-hook); `st.params` holds the last step's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    names = {p: n for n, p in model.named_parameters()}
    used: list[dict[str, torch.Tensor]] = []

    def post(o: object, args: object, kwargs: object) -> None:
        used.append({names[p]: p.grad.detach().clone() for p in model.parameters() if p.grad is not None})

    handle = opt.register_step_post_hook(post)
    tr = gradscape.Tracer(model, tensors=tensors)
    x = torch.randn(16, 5)
    with tr.step(0) as st:
        for _ in range(2):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    handle.remove()
    assert st is not None and len(st.optimizer_steps) == 2 and len(used) == 2
    assert any(not torch.equal(used[0][n], used[1][n]) for n in used[0])  # the two steps used different ones
    for rec, seen in zip(st.optimizer_steps, used):
        assert set(rec.grads) == set(seen)
        for name, g in seen.items():
            assert rec.grads[name].stats["norm"] == pytest.approx(float(torch.linalg.vector_norm(g.double())),
                                                                  rel=1e-5), name
            if tensors == "full":
                assert np.array_equal(rec.grads[name].values, g.numpy()), name
    for name, g in used[-1].items():
        assert st.params[name].stats["norm"] == pytest.approx(float(torch.linalg.vector_norm(g.double())), rel=1e-5)
