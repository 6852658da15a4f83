"""`st.params` on steps of several backward calls, whose `.grad` is summarised once, as the step ends or before a
clip, GradScaler or an optimizer changes it (NOTE [Settled at the step's end] in tracer/record/params.py). Each
check is against `torch.autograd.grad` of the same losses, or a clone the test takes itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import gradscape


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.a = nn.Linear(8, 1)
        self.b = nn.Linear(8, 1)


def _setup() -> tuple[_TwoHeads, list[torch.Tensor]]:
    torch.manual_seed(0)
    return _TwoHeads(), [torch.randn(5, 6) for _ in range(3)]


def _losses(m: _TwoHeads, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Three micro-batches: the first two through head `a`, the last through head `b`."""
    return [m.a(m.body(xs[0])).pow(2).mean(), m.a(m.body(xs[1])).pow(2).mean(), m.b(m.body(xs[2])).pow(2).mean()]


def _expected(m: _TwoHeads, xs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The accumulated gradients, from `torch.autograd.grad` of each micro-batch's loss (zeros where unreached)."""
    names, params = zip(*m.named_parameters())
    total = {n: torch.zeros_like(p) for n, p in zip(names, params)}
    for loss in _losses(m, xs):
        for n, g in zip(names, torch.autograd.grad(loss, params, allow_unused=True)):
            if g is not None:
                total[n] += g
    return total


def test_accumulated_gradients_let_go_by_zero_grad_are_kept() -> None:
    """Three passes accumulate; `zero_grad()` (set to None) inside the block does not lose them; head `a`, which
    the last pass does not reach, keeps what the second pass left."""
    m, xs = _setup()
    want = _expected(m, xs)
    tr = gradscape.Tracer(m, tensors="full")
    with tr.step(0) as st:
        for loss in _losses(m, xs):
            loss.backward()
        seen = {n: p.grad.clone() for n, p in m.named_parameters()}
        m.zero_grad()
    assert st is not None and len(st.passes) == 3
    assert set(st.params) == set(want)
    for name, g in want.items():
        assert torch.allclose(seen[name], g, rtol=1e-5, atol=1e-7), name
        assert np.array_equal(st.params[name].values, seen[name].numpy()), name
        assert st.params[name].stats["norm"] == pytest.approx(float(torch.linalg.vector_norm(seen[name].double())),
                                                              rel=1e-6), name
    assert not any("changed in place" in n for n in st.meta.get("notes", []))


def test_a_gradient_changed_in_place_unseen_is_noted_and_kept_as_the_step_ended() -> None:
    m, xs = _setup()
    tr = gradscape.Tracer(m, tensors="full")
    with tr.step(0) as st:
        for loss in _losses(m, xs):
            loss.backward()
        m.body.weight.grad.mul_(2.0)  # by the loop itself: no clip, GradScaler or optimizer the tracer sees
        seen = m.body.weight.grad.clone()
    assert st is not None
    assert np.array_equal(st.params["body.weight"].values, seen.numpy())
    (note,) = [n for n in st.meta["notes"] if "changed in place" in n]
    assert note.startswith("1 parameter gradient (body.weight) changed in place")


def test_a_clip_after_accumulation_sees_the_gradients_before_it() -> None:
    """The pending gradients are summarised before the clip changes them in place (so no note says they changed);
    `st.params` is what the optimizer stepped with, and the row's norm is the unclipped sum's."""
    m, xs = _setup()
    want = _expected(m, xs)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    tr = gradscape.Tracer(m, tensors="full")
    with tr.step(0) as st:
        for loss in _losses(m, xs):
            loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
        used = {n: p.grad.clone() for n, p in m.named_parameters()}
        opt.step()
        opt.zero_grad()
    assert st is not None
    for name, g in used.items():
        assert np.array_equal(st.params[name].values, g.numpy()), name
    before = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in want.values()])))
    assert tr.history[-1]["grad_norm"] == pytest.approx(before, rel=1e-5)
    assert tr.history[-1]["grad_norm_clipped"] == pytest.approx(1e-3, rel=1e-3)
    assert not any("changed in place" in n for n in st.meta.get("notes", []))


@pytest.mark.parametrize("recorder", ["native", "python"])
@pytest.mark.parametrize("with_optimizer", [False, True])
def test_accumulated_summaries_are_the_sums(recorder: str, with_optimizer: bool) -> None:
    """Summaries only (the native recorder records these steps and settles the accumulated gradients in one call
    into its tables): each `st.params` entry's statistics are the accumulated gradient's, as
    `torch.autograd.grad` gives it; with an optimizer, they are what it stepped with (here the same), and the
    problem finder, which reads the gradients as the backward left them, still finds no problem."""
    from gradscape.tracer.record import native

    if recorder == "native" and not native.status()[0]:
        pytest.skip("no native recorder here")
    m, xs = _setup()
    want = _expected(m, xs)
    opt = torch.optim.SGD(m.parameters(), lr=0.1) if with_optimizer else None
    tr = gradscape.Tracer(m, recorder=recorder)
    with tr.step(0) as st:
        for loss in _losses(m, xs):
            loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
    assert st is not None and st.meta["recorder"] == recorder
    assert set(st.params) == set(want)
    for name, g in want.items():
        stats = st.params[name].stats
        g64 = g.double()
        assert stats["norm"] == pytest.approx(float(torch.linalg.vector_norm(g64)), rel=1e-5), name
        assert stats["min"] == pytest.approx(float(g64.min()), rel=1e-5, abs=1e-9), name
        assert stats["max"] == pytest.approx(float(g64.max()), rel=1e-5, abs=1e-9), name
    assert not st.problems
