"""Two (or more) gloo ranks of tests/ddp_stream_worker.py streaming into a gradscape server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from serving import free_port

WORKER = Path(__file__).with_name("ddp_stream_worker.py")


def run_ranks(url: str, run: str, mode: str, out: Path, world: int = 2) -> tuple[list[Any], list[Any]]:
    """Start `world` ranks streaming into `url`; their npz arrays and json infos."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(world), url, run, mode, str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        logs = [p.communicate(timeout=170)[0] for p in procs]  # ~10 s on an idle machine
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0] * world, logs
    return ([np.load(out / f"rank{r}.npz") for r in range(world)],
            [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)])
