"""bench/peak_rss.py: each mode's peak resident memory read in a child process of its own, and a row a
workload with the ratios of those peaks."""

from __future__ import annotations

import re
import sys

import pytest

from bench import peak_rss

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


def test_a_row_a_workload_with_each_modes_peak(capsys: pytest.CaptureFixture[str]) -> None:
    assert peak_rss.main(["--workloads", "lstm2000", "--steps", "2"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("lstm2000")]
    assert len(rows) == 1, rows
    _, nodes, plain, monitor, traced, monitor_ratio, traced_ratio, held = rows[0]
    assert int(nodes) == pytest.approx(2000, abs=20)  # the traced child traced its steps
    plain_mib, traced_mib = float(plain), float(traced)
    # the loop's activations and gradients, then the same plus every traced step's summaries, kept (keep=2)
    assert 0 < plain_mib < traced_mib
    # the ratios are of the unrounded peaks; the figures printed are rounded to 0.1 MiB
    assert float(traced_ratio.rstrip("x")) == pytest.approx(traced_mib / plain_mib, rel=0.03)
    assert float(monitor_ratio.rstrip("x")) == pytest.approx(float(monitor) / plain_mib, rel=0.03)
    assert re.fullmatch(r"\d+\.\d", held)
