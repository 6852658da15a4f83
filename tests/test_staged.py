"""Staged statistics (NOTE [Staged statistics] in tracer/summary/staged.py): what a GPU step uses, run here
on the CPU, where there is no GPU, against numpy."""

from __future__ import annotations

import math

import pytest
import torch
from test_summary import _reference

from gradscape.tracer.summary import staged
from gradscape.tracer.summary.summariser import Summariser


def test_staged_statistics_across_full_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Staged statistics (NOTE [Staged statistics], run on the CPU here) over many tensors: of every float
    type, strided, with NaN and Inf, in buffers that fill up and are reduced mid-step, and tensors too big to
    stage, each checked against numpy."""
    monkeypatch.setattr("gradscape.tracer.summary.fastpath.native", lambda: None)
    monkeypatch.setattr(staged, "on_cpu", True)
    monkeypatch.setattr(staged, "STAGE_CAP", 1000)
    monkeypatch.setattr(staged, "STAGE_MAX", 900)
    reduced: list[int] = []
    reduce = staged.StagedStats._reduce
    monkeypatch.setattr(staged.StagedStats, "_reduce",
                        staticmethod(lambda buf: (reduced.append(buf.used), reduce(buf))))
    g = torch.Generator().manual_seed(5)
    xs = []
    for k in range(60):
        rows, cols = int(torch.randint(1, 40, (), generator=g)), int(torch.randint(1, 40, (), generator=g))
        x = torch.randn(rows, cols, generator=g, dtype=torch.float64) * 10.0 ** (k % 7 - 3)
        if k % 5 == 0:
            x[0, 0] = math.nan
        if k % 7 == 0:
            x.view(-1)[-1] = -math.inf
        x = x.to((torch.float32, torch.float64, torch.bfloat16, torch.float16)[k % 4])
        xs.append(x.t() if k % 3 == 0 else x)
    s = Summariser(thumb=8)
    traces = [s.summarise(x) for x in xs]
    s.finalize()
    assert len(reduced) >= 5 and max(reduced) <= 1000, reduced  # buffers filled and were reduced mid-step
    assert any(x.numel() > 900 for x in xs)  # and some tensors were too big to stage
    for k, (x, tr) in enumerate(zip(xs, traces)):
        for name, want in _reference(x).items():
            got = tr.stats[name]
            assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want, rel=2e-4, abs=1e-6), (k, name)
