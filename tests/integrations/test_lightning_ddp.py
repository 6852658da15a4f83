"""GradscapeCallback under Lightning's `strategy="ddp"`: two real gloo ranks on CPU (lightning_ddp_worker.py)
trace into one file under one run name, with the LightningModule's parameter names (no `module.` of the
DDP wrapper), and each step's parameter gradients are the all-reduced ones each rank's optimizer used."""

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

import gradscape

pytest.importorskip("lightning.pytorch")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_slow_ddp_ranks_trace_one_run_with_the_modules_names(tmp_path: Path) -> None:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore")
    worker = str(Path(__file__).with_name("lightning_ddp_worker.py"))
    proc = subprocess.run([sys.executable, worker, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=400)  # two Lightning imports on a busy 2-core machine; a guard, not a goal
    assert proc.returncode == 0, proc.stdout + proc.stderr
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [i["wrapper"] for i in infos] == ["DistributedDataParallel"] * 2
    assert infos[0]["run"] == infos[1]["run"] is not None  # rank 0 chose the name for both
    run = infos[0]["run"]
    with gradscape.TraceStore(tmp_path / "ddp.sqlite", readonly=True) as store:
        assert [r["run"] for r in store.runs()] == [run]
        assert store.ranks(run) == [0, 1]
        steps = {r: [store.read_step(run, s["step"], rank=r) for s in store.steps(run, rank=r)] for r in range(2)}
    names = ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    for r in range(2):
        assert [st.step for st in steps[r]] == [0, 1]
        for st in steps[r]:
            assert (st.rank, st.world_size, st.error) == (r, 2, None)
            assert sorted(st.params) == sorted(names)
            assert sorted(n.param for n in st.nodes if n.param) == sorted(names)
            used = infos[r]["used"][st.step]
            for name in names:
                assert np.array_equal(st.params[name].values.reshape(-1), np.float32(used[name])), (r, name)
    for name in names:  # each rank its own batch: different arrivals, one all-reduced gradient
        a0, a1 = (steps[r][0].param_node(name).grad_outputs[0].values for r in range(2))
        assert not np.array_equal(a0, a1), name
        assert np.array_equal(steps[0][0].params[name].values, steps[1][0].params[name].values), name
