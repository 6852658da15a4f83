"""Triggered traces: a loop that schedules no trace gets the step whose batch was scaled ×100 and the
step with a NaN input traced, with their reasons and problems, and nothing before them; the cap and
the cooldown; and training computes the same parameters, bit for bit, with triggers firing."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
from helpers import DEVICES

import gradscape
from gradscape.tracer.monitor import Triggers

SPIKE, NAN, STEPS = 30, 36, 40


def _setup(device: str = "cpu") -> tuple[nn.Module, torch.optim.Optimizer, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = []
    for i in range(STEPS):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        if i == SPIKE:
            x = x * 100
            y = y * 100
        if i == NAN:
            x[3, 5] = float("nan")
        data.append((x.to(device), y.to(device)))
    return model, opt, data


def _train(model: nn.Module, opt: torch.optim.Optimizer, data: list[tuple[torch.Tensor, torch.Tensor]],
           tr: gradscape.Tracer | None, last: int = STEPS) -> list[gradscape.StepTrace]:
    traces = []
    for i, (x, y) in enumerate(data[:last], start=1):  # from 1: step 0 would be scheduled by any `every`
        ctx = tr.step(i) if tr is not None else _Plain()
        with ctx:
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        if tr is not None and tr.last is not None and tr.last.step == i:
            traces.append(tr.last)
    return traces


class _Plain:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


def test_spike_and_nan_steps_are_traced_with_reasons_and_problems() -> None:
    model, opt, data = _setup()
    tr = gradscape.Tracer(model, every=10_000, norms_every=1)  # every step full: a trigger replays its own step
    traces = _train(model, opt, data, tr)
    by_step = {st.step: st for st in traces}
    spike, nan = SPIKE + 1, NAN + 1  # step numbers start at 1
    assert spike in by_step and nan in by_step
    assert min(by_step) == spike  # no trigger on the quiet steps before
    rows = tr.history
    assert all(r["trigger"] is None and not r["traced"] for r in rows if r["step"] < spike)
    st = by_step[spike]
    assert st.trigger == "loss_spike" and rows[spike - 1]["trigger"] == "loss_spike"
    assert st.nodes and st.params and st.passes  # that very backward: graph and every gradient
    prob = st.problems[0]
    assert prob.kind == "loss_spike" and prob.param in dict(model.named_parameters())
    assert prob.node is not None and st.nodes[prob.node].param == prob.param
    assert f"step {spike}" in prob.message and "rose first and most" in prob.message
    st = by_step[nan]
    assert st.trigger == "nonfinite" and math.isnan(rows[nan - 1]["loss"])
    kinds = [p.kind for p in st.problems]
    assert "nonfinite_forward" in kinds and "nonfinite_loss" in kinds
    assert st.meta["trigger"]["reason"] == "nonfinite"
    tr.close()


def test_triggers_off_and_capped() -> None:
    model, opt, data = _setup()
    tr = gradscape.Tracer(model, every=10_000, triggers=False)
    assert _train(model, opt, data, tr) == []
    assert len(tr.history) == STEPS  # the monitor still records every step
    model, opt, data = _setup()
    tr = gradscape.Tracer(model, every=10_000, triggers=Triggers(cap=1))
    traces = _train(model, opt, data, tr)
    assert [st.trigger for st in traces] == ["loss_spike"]  # the cap held the NaN step back
    model, opt, data = _setup()
    tr = gradscape.Tracer(model, every=10_000, triggers=["nonfinite"])
    assert [st.trigger for st in _train(model, opt, data, tr)] == ["nonfinite"]
    with pytest.raises(ValueError, match="unknown"):
        gradscape.Tracer(model, triggers=["loss_spikes"])


def test_a_diverged_run_is_not_traced_at_every_step() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    tr = gradscape.Tracer(model, every=10_000, norms_every=1)
    for i in range(1, 80):
        with tr.step(i):
            x = torch.randn(8, 4)
            if i >= 25:
                x[0, 0] = float("nan")  # every step from here on has a NaN loss
            model(x).pow(2).mean().backward()
            model.zero_grad()
    traced = [r["step"] for r in tr.history if r["traced"]]
    assert traced == [25, 25 + Triggers().cooldown + 1]


@pytest.mark.parametrize("device", DEVICES)
def test_parameters_bitwise_equal_with_triggers_firing(device: str) -> None:
    model, opt, data = _setup(device)
    twin, twin_opt = copy.deepcopy(model), None
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.01)
    tr = gradscape.Tracer(model, every=10_000, tensors="full")
    traces = _train(model, opt, data, tr, last=NAN)  # up to the NaN step, not past it
    assert traces and traces[0].trigger == "loss_spike"
    _train(twin, twin_opt, data, None, last=NAN)
    for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
        assert torch.equal(p, q), n
