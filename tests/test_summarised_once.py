"""A parameter's gradient is not summarised again when the optimizer steps with it unchanged since `settle` or a clip
summarised it, and is whenever something changed it in between: a clip, GradScaler's unscale, a fused optimizer's
unscale, an optimizer that writes `.grad` (NOTE [Summarised once] in tracer/record/params.py). `st.params` is checked
against what the optimizer stepped with, read in a step post-hook of the test's own."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn

import gradscape
from gradscape.tracer.record import native
from gradscape.tracer.record.native_step import NativeStep


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _used_by(opt: torch.optim.Optimizer, model: nn.Module) -> dict[str, torch.Tensor]:
    """What `opt` stepped with: the gradients as its step left them, read in the test's own post-hook."""
    names = {p: n for n, p in model.named_parameters()}
    used: dict[str, torch.Tensor] = {}

    def post(o: object, args: object, kwargs: object) -> None:
        for p in names:
            if p.grad is not None:
                used[names[p]] = p.grad.detach().clone()

    opt.register_step_post_hook(post)
    return used


def _count_summarised(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """How many times the native recorder was asked to summarise each tensor on its own (by `id`)."""
    counts: Counter[int] = Counter()
    original = NativeStep.summarise

    def spy(self: NativeStep, grads: list[torch.Tensor]) -> list[int]:
        counts.update(id(g) for g in grads)
        return original(self, grads)

    monkeypatch.setattr(NativeStep, "summarise", spy)
    return counts


def _step(model: nn.Module, opt: torch.optim.Optimizer, tr: gradscape.Tracer, clip: bool,
          grads: dict[str, Any], micro: int = 3) -> gradscape.StepTrace | None:
    torch.manual_seed(1)
    xs = [torch.randn(8, 6) * 4 for _ in range(micro)]
    with tr.step(0) as st:
        for x in xs:
            (model(x).pow(2).mean() / len(xs)).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-2)
        grads.update({n: p.grad for n, p in model.named_parameters()})  # the very tensors, not copies
        opt.step()
        opt.zero_grad()
    return st


@pytest.mark.parametrize(("micro", "clip", "times"), [(3, False, 1), (3, True, 2), (1, False, 1), (1, True, 1)],
                         ids=["accumulated", "accumulated-clipped", "one-call", "one-call-clipped"])
def test_each_gradient_is_summarised_again_only_when_it_changed(
        monkeypatch: pytest.MonkeyPatch, micro: int, clip: bool, times: int) -> None:
    """Then an Adam step. Three micro-batches: each `.grad` goes to the kernel on its own once, as the
    optimizer's pre-hook settles it; after a clip, once more (the clip changed it), and not a third time at the
    step. One call: its `.grad` is the arrival, summarised by the hooks, then again as what the step used (the
    loop may have changed it through `.data`), or as the clip left it, and not again at the step. `st.params`
    holds the statistics of what the optimizer stepped with either way."""
    if not native.status()[0]:
        pytest.skip("no native recorder here")
    counts = _count_summarised(monkeypatch)
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    used = _used_by(opt, model)
    grads: dict[str, torch.Tensor] = {}
    st = _step(model, opt, gradscape.Tracer(model), clip, grads, micro)
    assert st is not None and st.meta["recorder"] == "native" and len(st.passes) == micro
    assert [counts[id(g)] for g in grads.values()] == [times] * len(grads)
    assert set(st.params) == set(used)
    for name, g in used.items():
        stats, g64 = st.params[name].stats, g.double()
        assert stats["norm"] == pytest.approx(float(torch.linalg.vector_norm(g64)), rel=1e-6), name
        assert stats["max"] == pytest.approx(float(g64.max()), rel=1e-6), name
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in used.values()))
    assert (norm < 1.01e-2) == clip  # the clip did change what the optimizer used


@pytest.mark.parametrize("fused", [False, True], ids=["unscale_", "fused"])
def test_gradscaler_after_accumulation_gives_the_unscaled_gradients(fused: bool) -> None:
    """GradScaler's unscale (`unscale_`, or a fused optimizer's inside its step) changes the settled gradients in
    place without moving their version counters: `st.params` is still the unscaled gradient, bitwise."""
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused)
    used = _used_by(opt, model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    tr = gradscape.Tracer(model, tensors="full")
    torch.manual_seed(1)
    with tr.step(0) as st:
        for _ in range(2):
            scaler.scale(model(torch.randn(8, 6)).pow(2).mean()).backward()
        if not fused:
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
    assert st is not None and len(st.passes) == 2 and st.optimizer_steps[0].scale == 2.0 ** 10
    assert set(st.params) == set(used)
    for name, g in used.items():
        assert np.array_equal(st.params[name].values, g.numpy()), name  # type: ignore[arg-type]
    assert not np.array_equal(st.params["0.weight"].values, 2.0 ** 10 * used["0.weight"].numpy())


class _HalvingSGD(torch.optim.SGD):
    """An optimizer that writes `.grad` itself before stepping (as some hand-written ones do)."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(0.5)
        return super().step(closure)


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_an_optimizer_that_writes_the_gradients_is_read_as_it_left_them(recorder: str) -> None:
    if recorder == "native" and not native.status()[0]:
        pytest.skip("no native recorder here")
    model = _mlp()
    opt = _HalvingSGD(model.parameters(), lr=0.1)
    used = _used_by(opt, model)
    grads: dict[str, torch.Tensor] = {}
    st = _step(model, opt, gradscape.Tracer(model, recorder=recorder), False, grads)
    assert st is not None and st.meta["recorder"] == recorder
    for name, g in used.items():
        assert st.params[name].stats["norm"] == pytest.approx(float(torch.linalg.vector_norm(g.double())),
                                                              rel=1e-6), name
