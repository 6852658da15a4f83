"""The monitor's norms taken every k-th step (NOTE [Sampled norms] in tracer/monitor/sampling.py): k from
the measured cost, the rows that say which steps have norms, the norms on those steps still what
`clip_grad_norm_` returned, and the losses and GradScaler's skips still seen on every step."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from helpers import scaler_step

import gradscape
from gradscape.tracer.monitor.sampling import AIM, FLOOR, K_MAX, TIMED, UNSEEN, UNSEEN_FULL, WARMUP, NormSampler


def test_k_is_the_smallest_that_keeps_the_norms_within_the_budget() -> None:
    """The monitor's measured times count `UNSEEN_FULL` times on a full step (what its code costs the loop beyond
    its own clock)."""
    s = NormSampler()
    assert [s.due(False) for _ in range(WARMUP)] == [True] * WARMUP  # measured first
    s.took(9e-6, 109e-6)  # 9 us of norms measured (27 counted) in a 100 us step, aimed at 2 us a step
    assert s.k == math.ceil(UNSEEN_FULL * 9e-6 / (AIM * 100e-6)) == 14
    s.took(9e-6, 109e-6)
    s.took(12.5e-6, 5e-3)  # a stalled step raises neither the cost (the smallest) nor the time (the median)
    assert s.k == 14
    pattern = [s.due(False) for _ in range(28)]
    assert pattern == ([False] * 13 + [True]) * 2
    assert s.due(True) and s.due(False) is False  # a traced step takes them, and the count starts again
    big = NormSampler()
    big.took(15e-6, 50e-3)
    assert big.k == 1  # 30 us counted against a 50 ms step: every step


def test_k_spreads_a_full_steps_whole_cost_over_what_the_light_steps_leave_of_the_budget() -> None:
    """The budget is the whole monitor's (NOTE [Light steps] in tracer/monitor/light.py): a step with norms costs
    its norms and its own calls; a light step its own calls, which come off the budget first; the full steps
    always keep `FLOOR` of the step. (Times as measured; a full step's count `UNSEEN_FULL` times, a light step's
    `UNSEEN`.)"""
    s = NormSampler()
    s.took(10e-6, 110.25e-6, 0.25e-6)  # a full step: 10 us of norms, 0.25 us of its own; 100 us of the loop
    assert s.k == math.ceil(UNSEEN_FULL * 10.25e-6 / (AIM * 100e-6)) == 16  # no light step measured yet
    s.took(None, 100.25e-6, 0.25e-6)  # a light step: 0.25 us of its own
    s.took(10e-6, 110.25e-6, 0.25e-6)
    # on average over k steps: 0.5 us + (30.75 - 0.5) / k within the 2 us aimed at, as counted
    assert s.k == math.ceil((UNSEEN_FULL * 10.25e-6 - UNSEEN * 0.25e-6) / (AIM * 100e-6 - UNSEEN * 0.25e-6)) == 21
    heavy = NormSampler()
    heavy.took(None, 105e-6, 5e-6)  # the light steps' own 10 us counted are past the 2 us aimed at already
    heavy.took(9.75e-6, 114.75e-6, 5e-6)
    assert heavy.k == math.ceil((UNSEEN_FULL * 14.75e-6 - UNSEEN * 5e-6) / (FLOOR * 100e-6)) == 35
    big = NormSampler()
    big.took(15e-6, 50.05e-3, 35e-6)
    assert big.k == 1  # against a 50 ms step the norms and the rest fit: every step


def test_every_full_step_and_every_timed_light_step_give_the_sampler_their_times() -> None:
    """Measured in a real loop: every full untraced step reports the loop's time and its whole cost, and every
    `TIMED`-th step, when light, the loop's time and its own."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tr = gradscape.Tracer(model, every=10 ** 6)
    s = tr._monitor.sampler
    x = torch.randn(32, 8)
    for i in range(1, WARMUP + 13):  # (step i is the sampler's i-th)
        if i == WARMUP + 1:  # light from here on (k is worked out again only at the 16th step timed)
            s.k = K_MAX
        with tr.step(i):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    full = [r["step"] for r in tr.history if r["norms"]]
    timed = [r["step"] for r in tr.history if not r["norms"] and r["step"] % TIMED == 0]  # NOTE [Light steps]
    assert full == list(range(1, WARMUP + 1)) and timed == list(range(12, WARMUP + 13, TIMED))
    assert s.seen == WARMUP + len(timed) and len(s.times) == s.times.maxlen
    assert len(s.owns) == len(timed) and len(s.costs) == min(WARMUP, s.costs.maxlen)
    assert all(o > 0 for o in s.owns) and all(t > 0 for t in s.times) and all(c > 0 for c in s.costs)
    tr.close()


def test_a_fixed_k_and_its_checks() -> None:
    s = NormSampler(3)
    assert [s.due(False) for _ in range(7)] == [False, False, True, False, False, True, False]
    s.took(1.0, 1.1)
    assert s.k == 3  # fixed: not measured
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="norms_every"):
            gradscape.Tracer(nn.Linear(2, 1), norms_every=bad)


def test_rows_say_which_steps_have_norms_and_those_match_clip_grad_norm() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tr = gradscape.Tracer(model, every=5, norms_every=3, tensors="full")
    clipped: dict[int, float] = {}
    losses: dict[int, float] = {}
    traces = {}
    for i in range(12):
        with tr.step(i) as st:
            x = torch.randn(32, 6) * 10
            loss = (model(x) - 1.0).pow(2).mean()
            loss.backward()
            clipped[i] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5))
            opt.step()
            opt.zero_grad()
        losses[i] = float(loss.detach())
        if st is not None:
            traces[i] = st
    rows = {r["step"]: r for r in tr.history}
    # every 3rd step, counted from the last one with norms; traced steps (0, 5, 10) always have them
    assert [i for i in rows if rows[i]["norms"]] == [0, 3, 5, 8, 10]
    for i, r in rows.items():
        assert r["loss"] == losses[i]  # every step: the loss
        if r["norms"]:
            assert r["grad_norm"] == pytest.approx(clipped[i], rel=1e-6)
            assert r["grad_norm_clipped"] == pytest.approx(0.5, rel=1e-5)
            assert set(r["param_norms"]) == {n for n, _ in model.named_parameters()}
        else:
            assert r["grad_norm"] is None and r["grad_norm_clipped"] is None and r["param_norms"] == {}
            assert r["lr"] == {"SGD": [0.01]}
    for i, st in traces.items():
        assert st.optimizer_steps[0].grad_norm_before_clip == clipped[i]  # bitwise, as clip_grad_norm_'s


def test_a_nonfinite_loss_and_a_grad_scaler_skip_are_seen_on_steps_without_norms() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    tr = gradscape.Tracer(model, every=10 ** 6, norms_every=100)
    for i in range(1, 9):
        with tr.step(i):
            x = torch.randn(8, 4)
            if i == 6:
                x[0, 0] = float("nan")  # a NaN loss
            scaler_step(model, opt, scaler, model(x).pow(2).mean(), skip=i == 3)  # step 3: GradScaler skips
    rows = {r["step"]: r for r in tr.history}
    assert math.isfinite(rows[3]["loss"]) and not rows[3]["traced"]
    assert rows[3]["skipped"] and rows[3]["norms"]  # the skip seen, and its norms taken to name the parameters
    assert rows[3]["param_norms"]["weight"] != rows[3]["param_norms"]["weight"]  # NaN
    assert [i for i in rows if rows[i]["skipped"]] == [3, 6]
    assert rows[4]["traced"] and rows[4]["trigger"] == "amp_skipped"  # the step after the skip is traced
    assert math.isnan(rows[6]["loss"]) and rows[6]["traced"] and rows[6]["trigger"] == "nonfinite"
    assert not rows[2]["norms"] and not rows[7]["norms"]
