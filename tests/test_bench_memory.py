"""bench/memory.py: the page faults the benchmarks print, and `--steady-malloc`, which holds glibc's heap
(run in a child process: it changes the allocator of the process it runs in)."""

from __future__ import annotations

import mmap
import subprocess
import sys
from pathlib import Path

import pytest

from bench.memory import page_faults, page_size

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(sys.platform == "win32", reason="no `resource` module")
def test_page_faults_count_the_pages_first_touched() -> None:
    pages = (8 << 20) // page_size()
    region = mmap.mmap(-1, pages * page_size())
    before = page_faults()
    for k in range(pages):
        region[k * page_size()] = 1
    assert page_faults() - before >= pages * 0.9
    region.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_overhead_prints_page_faults_with_the_heap_held() -> None:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "overhead.py"), "--workloads", "W1", "--rounds", "1",
                          "--steady-malloc", "--clock", "cpu"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "malloc: glibc heap held: mmap and trim thresholds 256 MB" in out.stdout
    assert "clock: cpu" in out.stdout  # (the process's CPU time)
    line = next(ln for ln in out.stdout.splitlines() if "minor page faults a step" in ln)
    assert all(f"{mode} " in line for mode in ("plain", "traced", "untraced", "monitor", "triggered")), line
