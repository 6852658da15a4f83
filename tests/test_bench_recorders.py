"""bench/recorders.py: each recorder's traced step against a plain step, and the recorder each step really
used (a column must not be the Python recorder's under the native recorder's name)."""

from __future__ import annotations

import pytest

from bench import recorders


def test_each_recorder_traces_with_itself() -> None:
    m = recorders.measure("W1", "cpu", 2)
    assert set(m["median"]) == {"plain", "native", "python"}
    assert all(v > 0 for v in m["median"].values())
    assert m["used"] == {"native": "native", "python": "python"}  # `make test` builds the native recorder


def test_a_row_per_workload(capsys: pytest.CaptureFixture[str]) -> None:
    recorders.main(["--workloads", "W1", "--rounds", "1"])
    lines = capsys.readouterr().out.splitlines()
    cells = lines[2].split()
    assert cells[0] == "W1" and float(cells[1]) > 0
    assert all(c.endswith("x") and float(c[:-1]) > 0 for c in cells[2:4])
