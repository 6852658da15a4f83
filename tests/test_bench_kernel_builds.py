"""bench/kernel_builds.py: it times every build of the summary kernel that this CPU runs, and prints each one's
time and its ratio to the baseline build's for every shape and form."""

from __future__ import annotations

import re

import pytest
import torch

from bench import kernel_builds


def test_every_build_this_cpu_runs_gets_a_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    builds = kernel_builds.builds()
    assert "baseline" in builds
    threads = torch.get_num_threads()
    assert kernel_builds.main(["--calls", "3", "--rounds", "1"]) == 0
    assert torch.get_num_threads() == threads  # the benchmark's one thread is not left behind
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"builds this CPU runs: {', '.join(builds)};")
    rows = [ln for ln in lines[2:] if ln.strip()]
    assert len(rows) == 2 * len(kernel_builds.SHAPES)
    for row in rows:
        ratios = re.findall(r"\((\d+\.\d+)x\)", row)
        assert len(ratios) == len(builds), row
        assert ratios[0] == "1.00", row  # the baseline against itself
