"""Light rows (NOTE [Light rows] in tracer/monitor/light_rows.py): the rows of light steps join the history in
batches, a loss the rules might find sends its batch at once, and the quiet bound under which no loss is a spike
(NOTE [Quiet bound]) holds against the rule's definition, computed here by `statistics`."""

from __future__ import annotations

import math
import random
import statistics
import time

import pytest
import torch
import torch.nn as nn
from helpers import is_light, kept_rows

import gradscape
from gradscape.tracer.monitor import monitor as monitor_module
from gradscape.tracer.monitor.light_rows import BATCH
from gradscape.tracer.monitor.triggers import _MAD_SIGMA, SpikeRule

pytestmark = pytest.mark.usefixtures("light_kind")  # each test with the native and the Python light step


def _fires(window: list[float], x: float, k: float, ratio: float) -> bool:
    """The loss-spike rule by its definition (NOTE [Trigger rules])."""
    med = statistics.median(window)
    mad = statistics.median([abs(v - med) for v in window])
    return x - med > max(k * _MAD_SIGMA * mad, ratio * abs(med))


def _next_value(rnd: random.Random, centre: float) -> float:
    """A loss, or one chosen to pull the median down as fast as it can go, or one the window never holds."""
    roll = rnd.random()
    if roll < 0.3:
        return -1e6 if rnd.random() < 0.5 else centre - abs(centre) * 10 - 1
    if roll < 0.35:
        return float("nan")
    return rnd.gauss(centre, abs(centre) * 0.2 + 0.1)


def test_no_value_under_the_quiet_bound_is_a_spike_while_the_rule_takes_its_next_values() -> None:
    rnd = random.Random(7)
    probes = under = 0
    for trial in range(300):
        window, warmup = rnd.choice([(5, 3), (30, 5), (100, 20)])
        ratio, k = rnd.choice([0.0, 0.5, 1.0, 2.0]), rnd.choice([0.5, 3.0, 8.0])
        centre = rnd.choice([3.0, 0.01, -2.0, 0.0])
        rule = SpikeRule(window=window, warmup=warmup, k=k, ratio=ratio)
        held: list[float] = []
        for _ in range(rnd.randrange(0, 2 * window)):
            v = rnd.gauss(centre, abs(centre) * 0.2 + 0.1)
            rule.add(v)
            held = (held + [v])[-window:]
        adds = rnd.choice([1, 4, BATCH])
        pivot, ladder = rule.quiet_ladder(adds)
        below = 0
        for _ in range(adds):
            bound = ladder[below] if below < len(ladder) else -math.inf
            if bound > -math.inf:
                for x in (bound, math.nextafter(bound, -math.inf), bound - rnd.random() * (abs(bound) + 1)):
                    if len(held) >= max(warmup, 3) and math.isfinite(x):
                        probes += 1
                        assert not _fires(held, x, k, ratio), (trial, x, bound)
                        assert rule.excess(x) is None
            v = _next_value(rnd, centre)
            under += bound > -math.inf and math.isfinite(v) and v <= bound
            below += v < pivot
            rule.add(v)
            if math.isfinite(v):
                held = (held + [v])[-window:]
    assert probes > 2000 and under > 300  # (the bound was probed, and values fell under it)
    assert SpikeRule(window=100, warmup=20, k=8.0, ratio=1.0).quiet_ladder(BATCH)[1] == ()  # nothing known yet


def test_the_quiet_bound_lets_a_noisy_loss_through() -> None:
    """With the defaults, nearly every loss of a noisy falling curve, and of a loop whose batches differ in loss
    by a factor of three, is under the bound: its row waits for its batch."""
    rnd = random.Random(1)
    for curve in (lambda n: 2.0 * math.exp(-n / 400) + rnd.gauss(0, 0.05), lambda n: (0.5, 0.8, 1.2, 1.5)[n % 4]):
        rule = SpikeRule(window=100, warmup=20, k=8.0, ratio=1.0)
        passed = below = 0
        pivot, ladder = rule.quiet_ladder(BATCH)
        for n in range(1000):
            if n % BATCH == 0:
                pivot, ladder, below = *rule.quiet_ladder(BATCH), 0
            x = curve(n)
            if n >= 100:
                passed += below < len(ladder) and x <= ladder[below]
            below += x < pivot
            rule.add(x)
        assert passed >= 0.98 * 900


def _loss(model: nn.Module, i: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    return (model(x) - y).pow(2).mean() * scale


def test_light_rows_join_in_batches_and_a_spike_on_a_light_step_traces_the_next_step() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses: dict[int, float] = {}
    waiting = []  # light rows not yet in the history, as each step ended
    with gradscape.Tracer(model, every=10 ** 6, norms_every=1000) as tr:
        mon = tr._monitor
        for i in range(1, 181):
            ctx = tr.step(i)
            with ctx:
                loss = _loss(model, i % 4, scale=60.0 if i == 150 else 1.0)  # (four batches, over and over)
                loss.backward()
                opt.step()
                opt.zero_grad()
            losses[i] = loss.item()
            waiting.append(kept_rows(mon))
            if i == 150:  # the spike's batch joined as its step ended: the rules found it
                assert is_light(ctx) and not kept_rows(mon) and mon.triggers.pending is not None
        rows = tr.history
        (st,) = tr.steps
    assert [r["step"] for r in rows] == list(range(1, 181))
    assert all(r["losses"] == [losses[r["step"]]] for r in rows)  # bitwise: the loss the loop computed
    assert max(waiting) == BATCH - 1 and sum(w > 0 for w in waiting[100:149]) > 40  # kept, then joined in batches
    assert st.step == 151 and st.meta["trigger"]["reason"] == "loss_spike" and st.meta["trigger"]["step"] == 150
    assert rows[150]["traced"] and rows[150]["trigger"] == "loss_spike"


def test_light_rows_join_once_a_flush_interval_passed() -> None:
    """A slow loop's light rows reach the history (and the sinks) within `FLUSH_SECONDS`, not a batch later."""
    model = nn.Linear(4, 1)
    with gradscape.Tracer(model, every=10 ** 6, norms_every=1000) as tr:
        mon = tr._monitor
        for i in range(1, 200):
            with tr.step(i):
                _loss(model, i).backward()
            if kept_rows(mon):
                break
        assert kept_rows(mon)
        started = time.monotonic()
        while time.monotonic() - started < monitor_module.FLUSH_SECONDS:  # one step as long as the interval
            with tr.step(i + 1):
                _loss(model, i).backward()
                while time.monotonic() - started < monitor_module.FLUSH_SECONDS:
                    time.sleep(0.01)
        assert not kept_rows(mon) and mon.kept.rows()[-1]["step"] == i + 1


def test_learning_rates_as_each_light_step_ended_a_tensor_one_and_an_optimizer_seen_later() -> None:
    """The rates are read as each block ends, from the parameter groups the last full step saw (a float each), or
    one by one where a rate is a tensor (changed in place by the loop); an optimizer first seen stepping on a full
    step is on the rows from the next step on."""
    torch.manual_seed(0)
    a, b = nn.Linear(4, 1), nn.Linear(4, 1)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.5)
    opt_b = torch.optim.SGD(b.parameters(), lr=torch.tensor(0.25))
    want: dict[int, dict[str, list[float]]] = {}
    with gradscape.Tracer([a, b], every=10 ** 6, norms_every=10) as tr:
        for i in range(1, 41):
            with tr.step(i):
                (_loss(a, i) + _loss(b, i)).backward()
                opt_a.param_groups[0]["lr"] = 0.5 / i  # (a schedule of floats)
                opt_a.step()
                if i >= 15:  # seen stepping by the full step 20
                    opt_b.param_groups[0]["lr"].fill_(1.0 / i)  # (a tensor, changed in place)
                    opt_b.step()
                opt_a.zero_grad()
                opt_b.zero_grad()
            want[i] = {"SGD": [0.5 / i]} | ({"SGD#1": [float(torch.tensor(1.0 / i))]} if i >= 20 else {})
        rows = {r["step"]: r for r in tr.history}
    assert [i for i in rows if rows[i]["norms"]] == [10, 20, 30, 40]
    for i in range(11, 41):
        assert rows[i]["lr"] == want[i], i


def test_the_light_step_context_is_handed_out_again_and_holds_no_cycle(light_kind: str) -> None:
    """A light step's context is handed out again once closed; one not closed yet is not (another is made); the
    monitor holds no cycle through the model. The native block holds its Tracer from `open` to its end (`with
    Tracer(model).step(i)` leaves no other reference), so one handed out and never entered is a cycle, which the
    collector frees."""
    import gc
    import weakref

    model = nn.Linear(4, 1)
    tr = gradscape.Tracer(model, every=10 ** 6, norms_every=1000)
    with tr.step(100):  # (the first light step puts the backward wrappers in place; the native block opens after)
        _loss(model, 0).backward()
    first = tr.step(1)
    second = tr.step(2)  # (the first is not closed yet: a context of its own)
    assert is_light(first) and is_light(second) and second is not first
    assert (type(first).__name__ == "LightBlock") is (light_kind == "native")
    with second:
        _loss(model, 2).backward()
    with tr.step(3) as got:
        assert got is None
    assert tr.step(4) is second  # closed: handed out again
    with second:
        _loss(model, 4).backward()
    ref = weakref.ref(model.weight)  # (which the monitor holds)
    if light_kind == "native":
        with first:  # (closed: the block lets its Tracer go)
            _loss(model, 1).backward()
        assert tr.step(5) is first
    gc.collect()
    gc.disable()
    try:
        del model, tr, first, second
        assert ref() is not None or light_kind == "python"  # (native: the block handed out for step 5 holds it)
    finally:
        gc.enable()
    gc.collect()
    assert ref() is None


def test_a_closed_light_step_holds_no_cycle(light_kind: str) -> None:
    import gc
    import weakref

    model = nn.Linear(4, 1)
    tr = gradscape.Tracer(model, every=10 ** 6, norms_every=1000)
    for i in range(1, 5):
        with tr.step(i) as got:
            assert got is None
            _loss(model, i).backward()
    ctx = tr.step(9)
    assert (type(ctx).__name__ == "LightBlock") is (light_kind == "native")
    with ctx:  # (closed, as every context handed out)
        _loss(model, 9).backward()
    gc.collect()
    gc.disable()
    try:
        ref = weakref.ref(model.weight)
        del model, tr, ctx
        assert ref() is None  # freed as the last reference went, with no collection (no cycle through the monitor)
    finally:
        gc.enable()


def test_a_compared_compiled_step_rows_after_the_light_rows_kept_before_it() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    compiled = torch.compile(model, backend="eager")
    with gradscape.Tracer(model, every=10 ** 6, norms_every=1000) as tr:
        for i in range(1, 31):
            with tr.step(i):
                _loss(model, 0).backward()
        assert kept_rows(tr._monitor)  # (kept: past the rule's warm-up, under its bound)
        tr.compare_compiled(31, lambda: _loss(compiled, 0).backward())
        assert [r["step"] for r in tr.history] == list(range(1, 32))


def test_a_batch_joins_the_windows_as_its_values_one_by_one_would() -> None:
    """`TriggerState.add_quiet` (a batch of light rows' losses, by their place in the row) leaves each rule's window,
    sorted and in order, as `add_finite` of each value leaves it: small batches and batches re-sorted at once, past
    the window's end too."""
    from gradscape.tracer.monitor.triggers import BATCH_SORT, Triggers, TriggerState

    rnd = random.Random(7)
    batched, single = TriggerState(Triggers.resolve(True)), TriggerState(Triggers.resolve(True))
    window = batched.cfg.window
    for state in (batched, single):
        state.loss_trigger([1.0, 2.0])  # (a rule for each of two positions)
    for size in [1, BATCH_SORT - 1, BATCH_SORT, 31, window + 5, 3, 2 * window]:
        rows = [[rnd.gauss(1.0, 0.1), None if k % 3 == 0 else rnd.choice([0.5, 0.25, rnd.random()])]
                for k in range(size)]
        batched.add_quiet([[r[pos] for r in rows if r[pos] is not None] for pos in (0, 1)])
        for losses in rows:
            for pos, v in enumerate(losses):
                if v is not None:
                    single.loss_rules[pos].add_finite(v)
        for pos in (0, 1):
            a, b = batched.loss_rules[pos], single.loss_rules[pos]
            assert list(a.values) == list(b.values) and a.ordered == b.ordered and len(a.values) <= window
            assert a.ordered == sorted(a.values)
