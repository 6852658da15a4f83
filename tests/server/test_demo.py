"""`gradscape demo` (what `make run` runs): a new user sees a live trace within a minute."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
from serving import ROOT, ApiError, free_port, get_json


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_demo_streams_a_live_trace(tmp_path: Path, model: str) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gradscape", "demo", "--port", str(port), "--store",
                             str(tmp_path / "demo.sqlite"), "--model", model, "--every", "2"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        steps: list[dict[str, object]] = []
        while time.monotonic() < deadline and len(steps) < 2:
            with contextlib.suppress(OSError, ApiError):
                steps = get_json(f"http://127.0.0.1:{port}/api/runs/demo-{model}/steps", timeout=2)["steps"]
            time.sleep(0.2)
        assert len(steps) >= 2, "no live steps within a minute"
        assert [s["step"] for s in steps[:2]] == [0, 2]  # every 2nd step is traced
        graph = get_json(f"http://127.0.0.1:{port}/api/runs/demo-{model}/steps/0")
        assert graph["nodes"] and graph["order"]
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert f"http://127.0.0.1:{port}/" in out
