"""The monitor's kept history rows, light steps' rows compact until read (NOTE [Kept rows] in
tracer/monitor/kept_rows.py): what a real loop's history and a real trace file hold, against the loop's own losses
and learning rates; the last `keep` rows across batches; a batch's rows made once and taken apart."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import gradscape
from gradscape.tracer.monitor import light_native
from gradscape.tracer.monitor import monitor as monitor_module
from gradscape.tracer.monitor.kept_rows import KeptRows, LightBatch
from gradscape.tracer.monitor.rows import blank_row, row_without_norms


def _loop(tr: gradscape.Tracer, model: nn.Module, steps: int) -> list[tuple[int, float, float]]:
    """`steps` monitored steps, the learning rate changed every 7: (step, loss, lr) as the loop saw them."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    seen = []
    for i in range(steps):
        if i % 7 == 0:
            opt.param_groups[0]["lr"] = 0.01 / (1 + i)
        with tr.step(i):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            seen.append((i, loss.item(), opt.param_groups[0]["lr"]))
            opt.step()
            opt.zero_grad()
    return seen


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_a_trace_file_and_the_history_hold_every_step_once_as_the_loop_saw_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setattr(light_native, "ENABLED", native)
    path = tmp_path / "run.sqlite"
    model = nn.Linear(4, 1)
    with gradscape.Tracer(model, run="kept", sink=gradscape.FileSink(path), every=10 ** 6, norms_every=50) as tr:
        seen = _loop(tr, model, 300)
        mine = tr.history
    store = gradscape.TraceStore(str(path))
    stored = store.history("kept")
    store.close()
    for rows in (mine, stored):
        assert [(r["step"], r["loss"], r["lr"]["SGD"][0]) for r in rows] == seen
        assert all(r["losses"] == [r["loss"]] for r in rows)
        assert sum(r["norms"] for r in rows) >= 5  # (the full steps are among them, in place)


def test_the_history_keeps_the_last_rows_across_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor_module, "KEEP_ROWS", 45)
    model = nn.Linear(4, 1)
    with gradscape.Tracer(model, every=10 ** 6, norms_every=40) as tr:
        seen = _loop(tr, model, 200)
        rows = tr.history
    assert [(r["step"], r["loss"]) for r in rows] == [s[:2] for s in seen[-45:]]


def _batch(first: int, n: int, per: int = 1) -> LightBatch:
    steps = torch.arange(first, first + n, dtype=torch.int64).numpy().tobytes()
    nloss = (torch.full((n,), per, dtype=torch.int64)).numpy().tobytes()
    losses = [float(s * 10 + k) for s in range(first, first + n) for k in range(per)]
    lrs = [{"SGD": [float(s)]} for s in range(first, first + n)]
    return LightBatch(blank_row(3), memoryview(steps).cast("q"), memoryview(nloss).cast("q"), losses, lrs)


def _expected(first: int, n: int, per: int = 1) -> list[dict[str, Any]]:
    return [row_without_norms(s, [float(s * 10 + k) for k in range(per)], {"SGD": [float(s)]}, 3)
            for s in range(first, first + n)]


def test_kept_rows_trim_inside_a_batch_and_keep_unsent_rows_apart() -> None:
    kept = KeptRows(10)
    kept.add_batches([_batch(0, 4, per=2)])
    kept.add(_expected(4, 1, per=2)[0])
    kept.add_batches([_batch(5, 8, per=2), _batch(13, 0)])
    assert kept.n == 10 and kept.rows() == _expected(3, 10, per=2)
    assert kept.n_unsent == 13 and kept.take_unsent() == _expected(0, 13, per=2)
    assert kept.n_unsent == 0 and kept.take_unsent() == []
    kept.add_batches([_batch(13, 3, per=2)])
    assert kept.rows() == _expected(6, 10, per=2) and kept.take_unsent() == _expected(13, 3, per=2)


def test_a_batch_makes_its_rows_once_and_pops_its_last() -> None:
    b = _batch(7, 5, per=3)
    assert b.pop() == _expected(11, 1, per=3)[0] and len(b) == 4
    first = b.wires()
    assert first == _expected(7, 4, per=3) and b.wires() is first
    assert b.tail(3).wires() == _expected(10, 1, per=3) and b.tail(3).losses == [100.0, 101.0, 102.0]
    assert b.pop() == _expected(10, 1, per=3)[0] and b.wires() == _expected(7, 3, per=3)


def test_a_batch_whose_columns_disagree_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="3 steps, 3 loss counts \\(3 losses\\), 2 rates and 3 losses"):
        LightBatch(blank_row(1), [1, 2, 3], [1, 1, 1], [0.1, 0.2, 0.3], [{}, {}])
    with pytest.raises(ValueError, match="2 steps, 2 loss counts \\(3 losses\\), 2 rates and 2 losses"):
        LightBatch(blank_row(1), [1, 2], [1, 2], [0.1, 0.2], [{}, {}])


@pytest.mark.parametrize("to_file", [False, True], ids=["memory", "file"])
def test_a_long_monitored_run_leaves_the_collector_few_objects_a_step(tmp_path: Path, to_file: bool) -> None:
    """The kept light rows are batches, not two tracked objects a row (a dict and its losses' list), whether a sink
    takes the history (its rows made for it and let go) or not: under one a step, with the learning rates' dict and
    list of every 7 steps (the loop changes the rate)."""
    model = nn.Linear(4, 1)
    sink = gradscape.FileSink(tmp_path / "run.sqlite") if to_file else None
    with gradscape.Tracer(model, every=10 ** 6, sink=sink) as tr:
        _loop(tr, model, 300)
        gc.collect()
        before = len(gc.get_objects())
        _loop(tr, model, 2000)
        gc.collect()
        grown = len(gc.get_objects()) - before
        assert len(tr.history) == 2300
    assert grown < 2000, f"{grown} objects more for 2,000 steps"
