"""DistributedDataParallel, for real: two gloo processes on CPU (tests/ddp_worker.py). st.params holds
the all-reduced gradient (what the optimizer sees), bit for bit, and tracing changes no gradient."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ddp_two_ranks_report_the_all_reduced_gradient(tmp_path: Path) -> None:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1")
    worker = str(Path(__file__).with_name("ddp_worker.py"))
    procs = [subprocess.Popen([sys.executable, worker, str(r), "2", str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        logs = [p.communicate(timeout=170)[0] for p in procs]  # ~17 s on an idle machine; a guard, not a goal
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], logs
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, (arr, info) in enumerate(zip(ranks, infos)):
        assert (info["rank"], info["world_size"], info["error"]) == (r, 2, None)
        assert info["modules"]["ReluBackward0"] == "module"  # made in MLP.forward, not by the DDP wrapper
        assert info["modules"]["AddmmBackward0"] in ("module.fc1", "module.fc2")
        for name in info["names"]:
            assert np.array_equal(arr[f"params/{name}"], arr[f"grad/{name}"]), (r, name)  # what the optimizer sees
            assert np.array_equal(arr[f"grad/{name}"], arr[f"untraced/{name}"]), (r, name)  # tracing changed nothing
            assert np.array_equal(arr[f"grad/{name}"], ranks[0][f"grad/{name}"]), (r, name)  # all-reduced
            assert not np.allclose(arr[f"params/{name}"], arr[f"local/{name}"]), (r, name)  # not rank-local
            assert np.allclose(arr[f"arrived/{name}"], arr[f"local/{name}"], atol=1e-6), (r, name)  # what arrived
