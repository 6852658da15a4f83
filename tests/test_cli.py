"""The example loop (examples/mlp_seed001.py) and the `gradscape` command, run for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_example_loop_prints_a_readable_step(tmp_path: Path) -> None:
    out = tmp_path / "mlp.sqlite"
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "mlp_seed001.py"), "--steps", "3", "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "run 'mlp-seed001' step 2: 16 autograd nodes" in res.stdout
    assert "mat2 → fc3.weight (transposed)" in res.stdout
    assert "fc2 (Linear): grad_input [4×20]  grad_output [4×30]" in res.stdout
    assert res.stderr == ""

    show = subprocess.run([sys.executable, "-m", "gradscape", "show", str(out), "--step", "1"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert show.returncode == 0 and "step 1:" in show.stdout
    missing = subprocess.run([sys.executable, "-m", "gradscape", "show", str(out), "--step", "9"], capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
    assert missing.returncode == 2 and "no step 9 of run 'mlp-seed001'" in missing.stderr
