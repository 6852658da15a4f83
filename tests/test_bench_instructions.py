"""bench/instructions.py: the process it counts under callgrind (run here without valgrind, whose start of torch
takes minutes) runs its steps in each mode and leaves at once, and the command refuses what it cannot count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "instructions.py"


@pytest.mark.parametrize(("mode", "k"), [("plain", "-"), ("light", "1000000"), ("traced", "1")])
def test_the_counted_process_runs_its_steps_and_says_its_samplers_k(mode: str, k: str) -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--inner", "gan", mode, "3"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == f"k {k}"  # the light mode's k is its fixed norms_every


def test_an_unknown_mode_is_refused_by_name() -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--modes", "plain,bogus"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "--modes is a subset of plain,monitor,light,traced" in out.stderr
