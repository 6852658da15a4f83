"""Light steps (NOTE [Light steps] in tracer/monitor/light.py): a monitored step without norms reads its losses
and the learning rates and installs nothing else; a loss trigger on one traces the next step; a GradScaler seen
on one is read, and makes every later step full. And the loss rule they run (NOTE [Trigger rules])."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch
import torch.nn as nn
from helpers import is_light, scaler_step

import gradscape
from gradscape.tracer.monitor.triggers import _MAD_SIGMA, SpikeRule
from gradscape.tracer.record import global_hooks, patched_calls

pytestmark = pytest.mark.usefixtures("light_kind")  # each test with the native and the Python light step


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)


def test_a_light_step_reads_its_losses_and_learning_rates_and_installs_nothing_else() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    losses: dict[int, float] = {}
    lrs: dict[int, float] = {}
    with gradscape.Tracer(model, every=10 ** 6, norms_every=4) as tr:  # steps 4 and 8 full, the others light
        for i in range(1, 10):
            ctx = tr.step(i)
            assert is_light(ctx) is (i % 4 != 0)
            with ctx:
                x, y = _batch(i)
                loss = (model(x) - y).pow(2).mean()
                if i % 4:  # nothing of a full step's: no forward snapshot, no optimizer hook
                    assert "forward" not in vars(model) and not global_hooks._watching
                loss.backward()
                lrs[i] = opt.param_groups[0]["lr"]
                opt.step()
                opt.zero_grad()
            losses[i] = loss.item()
            sched.step()
        assert not tr._active and not patched_calls._captures
        rows = {r["step"]: r for r in tr.history}
    assert [i for i in rows if rows[i]["norms"]] == [4, 8]
    for i, r in rows.items():
        assert r["loss"] == losses[i] and r["losses"] == [losses[i]]  # bitwise: the loss the loop computed
        if i > 4:  # the learning rate as the block ended, of each optimizer a full step saw stepping
            assert r["lr"] == {"SGD": [lrs[i]]}
        if not r["norms"]:
            assert r["grad_norm"] is None and not r["traced"] and r["trigger"] is None
    assert rows[1]["lr"] == {}  # no full step yet: no optimizer known


def test_a_nonfinite_loss_on_a_light_step_traces_the_next_step() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    with gradscape.Tracer(model, every=10 ** 6, norms_every=1000) as tr:
        for i in range(1, 9):
            with tr.step(i):
                x, y = _batch(i)
                if i == 5:
                    x[0, 0] = float("nan")
                (model(x) - y).pow(2).mean().backward()
                model.zero_grad()
        rows = {r["step"]: r for r in tr.history}
        (st,) = tr.steps
    assert math.isnan(rows[5]["loss"]) and not rows[5]["traced"] and not rows[5]["norms"]
    assert rows[6]["traced"] and rows[6]["trigger"] == "nonfinite"
    assert st.step == 6 and st.meta["trigger"]["reason"] == "nonfinite" and st.meta["trigger"]["step"] == 5
    assert "replay" not in st.meta  # (no snapshot on a light step: nothing replayed)


def test_a_grad_scaler_seen_on_a_light_step_is_read_and_every_later_step_is_full() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    kinds: list[bool] = []
    with gradscape.Tracer(model, every=10 ** 6, norms_every=1000) as tr:
        for i in range(1, 5):
            ctx = tr.step(i)
            kinds.append(is_light(ctx))
            with ctx:
                x, y = _batch(i)
                scaler_step(model, opt, scaler, (model(x) - y).pow(2).mean(), skip=i in (1, 3))
        rows = {r["step"]: r for r in tr.history}
    assert kinds == [True, False, False, False]
    assert [i for i in rows if rows[i]["skipped"]] == [1, 3]  # the light step's skip read at its end
    assert rows[2]["traced"] and rows[2]["trigger"] == "amp_skipped"
    assert rows[3]["norms"] and not rows[1]["norms"]  # a full step's skip has its norms taken


def test_an_exception_in_a_light_step_leaves_nothing_behind() -> None:
    model = nn.Linear(4, 1)
    with gradscape.Tracer(model, every=10 ** 6, norms_every=1000) as tr:
        try:
            with tr.step(1):
                assert tr._active and patched_calls._captures
                try:
                    tr.step(2)
                except RuntimeError as err:
                    assert "nested" in str(err)
                else:
                    raise AssertionError("a nested step was not refused")
                raise KeyError("the loop's")
        except KeyError:
            pass
        assert not tr._active and not patched_calls._captures
        with tr.step(2):
            model(torch.ones(2, 4)).sum().backward()
        assert [r["step"] for r in tr.history] == [1, 2]


def _brute(values: list[float], x: float, k: float, ratio: float) -> tuple[float, float] | None:
    med = statistics.median(values)
    mad = statistics.median([abs(v - med) for v in values])
    limit = max(k * _MAD_SIGMA * mad, ratio * abs(med))
    return (med, med + limit) if x - med > limit else None


def test_the_spike_rule_is_exact_at_every_value() -> None:
    """The window kept sorted: the rule's answer is what its definition computes from the last `window` values,
    at every value (until this release the median and MAD were taken every 4 values)."""
    rnd = random.Random(3)
    for ratio in (1.0, 0.25):
        rule = SpikeRule(window=30, warmup=5, k=3.0, ratio=ratio)
        seen: list[float] = []
        hits = 0
        for n in range(400):
            x = rnd.choice([rnd.gauss(5.0 - n / 100, 0.3), rnd.gauss(20.0, 1.0), float("nan")]) if n % 7 == 0 \
                else rnd.gauss(5.0 - n / 100, 0.3)
            want = _brute(seen[-30:], x, 3.0, ratio) if len(seen) >= 5 and math.isfinite(x) else None
            got = rule.excess(x)
            assert got == want, (n, x)
            hits += got is not None
            rule.add(x)
            if math.isfinite(x):
                seen.append(x)
        assert hits > 3  # the spikes were there to find


def test_take_is_excess_then_add() -> None:
    """`SpikeRule.take` (a full step's one call for each loss and its norm) answers what `excess` and then `add` of
    the same value answer, and leaves the same window, with the ratio's bound and without it (ratio 0: the MAD,
    refreshed every few values), through the warm-up and with spikes among the values."""
    rnd = random.Random(5)
    for ratio, warmup in ((1.0, 5), (0.0, 3), (0.25, 8)):
        one, two = (SpikeRule(window=20, warmup=warmup, k=3.0, ratio=ratio) for _ in range(2))
        hits = 0
        for n in range(300):
            x = rnd.gauss(20.0, 1.0) if n % 11 == 0 else rnd.gauss(5.0, 0.3)
            check = n % 5 != 0
            want = two.excess(x) if check else None
            two.add(x)
            got = one.take(x, check)
            assert got == want, (ratio, n, x)
            assert (one.ordered, list(one.values), one._mad) == (two.ordered, list(two.values), two._mad)
            hits += got is not None
        assert hits > 5
