"""Tutorial 7: two ranks side by side under DistributedDataParallel.

    python examples/ddp_two_ranks.py

Starts two processes (gloo, on the CPU, rendezvous at 127.0.0.1 on a free port). Each rank wraps the same
model in DDP, traces one step on its own batch into ONE shared trace file (`sink=<file>`, the same `run`),
and also computes, with `torch.autograd.grad`, its rank-local gradients for the check. Then this process reads
both ranks back (`gradscape.load(path, rank=r)`) and shows them side by side: what arrived at each
parameter's AccumulateGrad node is the rank's own gradient (different on each rank), and `st.params` holds the
all-reduced gradient the optimizer steps with (the same on both). The page shows the same with its rank
select and its compare… view.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradscape

RUN, WORLD = "ddp-tutorial", 2


def rank_main(rank: int, out: Path) -> None:
    """One rank: a DDP step traced into the shared file, and its rank-local gradients saved for the check."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)  # the same initial model on every rank
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    x, y = torch.randn(8, 3, generator=gen), torch.randint(0, 2, (8,), generator=gen)
    local = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))  # no all-reduce here
    np.savez(out / f"local{rank}.npz", **{n: g.numpy() for (n, _), g in zip(model.named_parameters(), local)})

    ddp = DistributedDataParallel(model)
    with gradscape.Tracer(ddp, sink=str(out / "ddp.sqlite"), run=RUN, tensors="full") as tr, tr.step(0):
        F.cross_entropy(ddp(x), y).backward()
    dist.barrier()  # both ranks written before rank 0, which holds the rendezvous, leaves
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(out: Path) -> None:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--out", str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(WORLD)]
    try:
        logs = [p.communicate(timeout=170)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0] * WORLD, logs


def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        launch(out)
        steps = [gradscape.load(out / "ddp.sqlite", run=RUN, rank=r) for r in range(WORLD)]
        local = [dict(np.load(out / f"local{r}.npz")) for r in range(WORLD)]
    print(f"{'parameter':18s} {'arrived, rank 0':>16s} {'arrived, rank 1':>16s} {'st.params (both)':>17s}")
    for name in local[0]:
        traced = f"module.{name}" if f"module.{name}" in steps[0].params else name  # DDP's own name for it
        arrived = []
        for r, st in enumerate(steps):
            node = st.param_node(traced)
            assert node is not None and node.grad_outputs is not None and node.grad_outputs[0] is not None
            arrived.append(node.grad_outputs[0].values)
            np.testing.assert_allclose(arrived[r], local[r][name], rtol=1e-5, atol=1e-7)  # the rank's own
        reduced = [st.params[traced].values for st in steps]
        assert reduced[0] is not None and reduced[1] is not None
        np.testing.assert_array_equal(reduced[0], reduced[1])  # after the all-reduce: equal on every rank
        np.testing.assert_allclose(reduced[0], (local[0][name] + local[1][name]) / 2, rtol=1e-5, atol=1e-7)
        assert not np.allclose(arrived[0], arrived[1])  # each rank's batch: different gradients arrived
        print(f"{traced:18s} {np.linalg.norm(arrived[0]):16.5f} {np.linalg.norm(arrived[1]):16.5f} "
              f"{np.linalg.norm(reduced[0]):17.5f}")
    print(f"\nranks {[st.rank for st in steps]} of world size {steps[0].world_size}, one trace file, run {RUN!r}")
    return {"ranks": [st.rank for st in steps], "world_size": steps[0].world_size, "params": sorted(steps[0].params)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="two DDP ranks side by side")
    ap.add_argument("--rank", type=int, default=None, help="(internal) run as this rank")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.rank is None:
        main()
    else:
        rank_main(args.rank, args.out)
