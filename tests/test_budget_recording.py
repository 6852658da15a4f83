"""The thumbnail budget applied while the native recorder records (NOTE [Budget while recording] in
tracer/record/csrc/budget.h): the step keeps exactly the pictures, and says exactly what it left out, as when the
budget is applied only at the step's end, while its arena holds a fraction of the pictures along the way."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import gradscape
from gradscape.tracer.record import native
from gradscape.tracer.summary.budget import apply_thumb_budget, past_budget, past_budget_raw

pytestmark = pytest.mark.skipif(not native.status()[0], reason="the native recorder applies it while recording")

BUDGET = 60_000  # cells: about 60 of the loop's 1,024-cell gate gradients


def _loop_step(budget: int | None, steps: int = 500, nan_at: int | None = None,
               stepped: bool = False) -> tuple[Any, torch.nn.LSTMCell]:
    """A traced step of an LSTMCell loop (500 steps: about 7,500 nodes, 8 MiB of arena pictures without a budget),
    and its cell; the same weights and inputs every call. `nan_at`: a NaN put into the input of that time step;
    `stepped`: an optimizer steps inside the block (with a learning rate of 0)."""
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(16, 32)
    x = torch.randn(steps, 8, 16)
    if nan_at is not None:
        x[nan_at, 0, 0] = float("nan")
    opt = torch.optim.SGD(cell.parameters(), lr=0.0)
    tr = gradscape.Tracer(cell, thumb_budget=budget)
    with tr.step(0) as st:
        h = c = torch.zeros(8, 32)
        for t in range(steps):
            h, c = cell(x[t], (h, c))
        h.pow(2).sum().backward()
        if stepped:
            opt.step()
    assert st.meta["recorder"] == "native"
    return st, cell


def _pictures(st: Any) -> list[bytes | None]:
    tt = st.nodes.tables.tensors
    return [None if (th := tt.thumb_of(k)) is None else th.tobytes() + str(th.shape).encode() for k in range(len(tt))]


def _same_as_the_end_budget(nan_at: int | None = None) -> tuple[Any, Any]:
    cut = _loop_step(BUDGET, nan_at=nan_at)[0]
    end = _loop_step(None, nan_at=nan_at)[0]  # nothing left out while recording: the budget applied at the end only
    end.meta["arena"] = sum(c.nbytes for c in end.nodes.tables.tensors.chunks)  # every picture, as recorded
    apply_thumb_budget(end, BUDGET, end.nodes.tables.tensors.cells_bound)
    assert cut.nodes.tables.tensors.evicted.sum() > 1000, "the budget did not act while recording"
    assert cut.meta["thumbs_left_out"] == end.meta["thumbs_left_out"] and "arena" not in cut.meta
    assert _pictures(cut) == _pictures(end)
    return cut, end


def test_the_pictures_kept_and_the_count_left_out_are_the_end_budgets() -> None:
    cut, end = _same_as_the_end_budget()
    assert cut.meta["thumbs_left_out"]["count"] > 1000
    tt = cut.nodes.tables.tensors
    stats = tt.stats_array()
    assert np.array_equal(stats, end.nodes.tables.tensors.stats_array(), equal_nan=True)  # every statistic kept
    # the arena as recorded held the pictures kept and every summary's statistics, not all the pictures
    assert int(tt.thumb_cells().sum()) <= BUDGET
    assert sum(c.nbytes for c in tt.chunks) < end.meta["arena"] / 2, (sum(c.nbytes for c in tt.chunks), end.meta)


def test_a_nan_keeps_its_picture_first() -> None:
    """Gradients with a NaN come first in the budget's order, while recording as at the end."""
    cut, _end = _same_as_the_end_budget(nan_at=5)
    tt = cut.nodes.tables.tensors
    flagged = tt.flagged()
    shown = np.array([tt.thumb_of(k) is not None for k in range(len(tt))])
    assert flagged.any() and shown[flagged & (tt.thumb_cells() > 0)].any()


def test_what_each_row_shows_is_what_the_gradients_were() -> None:
    """Against torch: what the optimizer stepped with, summarised while pictures were being left out, keeps its
    pictures (the largest norms) and the statistics of `p.grad`."""
    st, cell = _loop_step(BUDGET, stepped=True)
    assert st.nodes.tables.tensors.evicted.any()
    for name, p in cell.named_parameters():
        t = st.params[name]
        assert t.thumb is not None, name  # a parameter's whole gradient: among the largest norms
        g = p.grad.double()
        assert t.stats["norm"] == pytest.approx(float(g.norm()), rel=1e-6), name
        assert (t.stats["min"], t.stats["max"]) == (float(p.grad.min()), float(p.grad.max())), name


def test_a_budget_that_fails_while_recording_leaves_its_pictures_to_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """The order comes from the Python budget (`past_budget_raw`); if that call fails (a fault forced here), the
    recorder leaves nothing out while recording, and the step's end still applies the budget in full."""
    calls: list[int] = []

    def broken(raw: bytes, cells: bytes, budget: int) -> bytes:
        calls.append(budget)
        raise MemoryError("forced")

    monkeypatch.setattr(native, "past_budget_raw", broken)
    st = _loop_step(BUDGET)[0]
    tt = st.nodes.tables.tensors
    assert calls and not tt.evicted.any()
    end = _loop_step(None)[0]
    apply_thumb_budget(end, BUDGET, end.nodes.tables.tensors.cells_bound)
    assert st.meta["thumbs_left_out"] == end.meta["thumbs_left_out"]
    assert _pictures(st) == _pictures(end)


def test_the_order_while_recording_is_the_budget_s() -> None:
    """`past_budget_raw` (what the recorder calls) and `past_budget` (what the step's end calls) agree, NaN first."""
    raw = np.zeros((5, 8))
    raw[:, 7] = 4.0
    raw[:, 3] = [1.0, 9.0, 4.0, 9.0, 0.25]  # norms 1, 3, 2, 3, 0.5
    raw[4, 5] = 1.0  # a NaN counted: first
    cells = np.array([10, 10, 10, 10, 10], np.int64)
    past = np.frombuffer(past_budget_raw(raw.tobytes(), cells.tobytes(), 30), np.int64)
    assert past.tolist() == [2, 0]  # kept: the NaN, then norm 3 (position 1 before 3); past: 2, then 1
    norms = np.sqrt(raw[:, 3])
    assert past_budget(cells, norms, raw[:, 5] > 0, 30).tolist() == past.tolist()


def test_the_step_s_end_reports_the_largest_norm_it_left_out_as_it_was() -> None:
    """A NaN norm is ordered as -1 (last) and reported so; an infinite one (a float64 gradient whose squares
    overflow) is the largest, and is reported as infinite, not as the largest float."""
    from gradscape.tracer._model import StepTrace, TensorTrace

    def trace(norm: float) -> TensorTrace:
        return TensorTrace((4, 4), "float32", {"norm": norm, "nan": 0.0, "inf": 0.0}, np.zeros((4, 4), np.float32),
                           "matrix", None, "cpu")
    st = StepTrace(run="r", step=0)
    st.params.update({"inf": trace(math.inf), "nan": trace(math.nan), "one": trace(1.0), "two": trace(2.0)})
    assert apply_thumb_budget(st, 16) == 3  # one picture of 16 cells fits: the infinite norm's
    assert st.params["inf"].thumb is not None and st.meta["thumbs_left_out"]["max_norm"] == 2.0
    st = StepTrace(run="r", step=1)
    st.params.update({"nan": trace(math.nan), "a": trace(math.inf), "b": trace(math.inf)})
    assert apply_thumb_budget(st, 16) == 2
    assert st.params["a"].thumb is not None and st.meta["thumbs_left_out"]["max_norm"] == math.inf
    st = StepTrace(run="r", step=2)
    st.params.update({"one": trace(1.0), "nan": trace(math.nan)})
    assert apply_thumb_budget(st, 16) == 1 and st.meta["thumbs_left_out"]["max_norm"] == -1.0
