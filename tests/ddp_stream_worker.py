"""One rank of a 2-process gloo run streaming into a gradscape server; run by tests/test_ranks.py as a
subprocess with MASTER_ADDR/MASTER_PORT set.

    ddp_stream_worker.py RANK WORLD URL RUN MODE OUT

MODE `ddp`: DistributedDataParallel (gradients all-reduced); `desync`: the same model WITHOUT DDP, each
rank its own data (no all-reduce: the ranks' parameter gradients differ, the bug the compare view
shows); `fsdp`: FSDP2 `fully_shard`. Writes the gradients the optimizer saw to `OUT/rank<r>.npz`,
checked against torch.autograd.grad in the same process (`OUT/rank<r>.json` says so)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from zoo import RankMLP as MLP

import gradscape


def main() -> None:
    rank, world, url, run, mode, out = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5],
                                        Path(sys.argv[6]))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    base = MLP()
    if mode == "ddp":
        model: nn.Module = DistributedDataParallel(base)
    elif mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        model = fully_shard(base)
    else:
        model = base
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    batches = [(torch.randn(8, 3, generator=gen), torch.randint(0, 2, (8,), generator=gen)) for _ in range(2)]
    tr = gradscape.Tracer(model, run=run, sink=url, tensors="full")
    grads: dict[str, np.ndarray] = {}
    info: dict[str, object] = {"rank": None, "world_size": None, "errors": []}
    for i, (x, y) in enumerate(batches):
        model.zero_grad()
        with tr.step(i) as st:
            F.cross_entropy(model(x), y).backward()
        assert st is not None
        info.update(rank=st.rank, world_size=st.world_size)
        if st.error:
            info["errors"].append(st.error)  # type: ignore[attr-defined]
        for name, p in model.named_parameters():
            g = p.grad
            if g is not None and hasattr(g, "full_tensor"):
                grads[f"{i}/local/{name}"] = g.to_local().detach().numpy().copy()  # this rank's shard (FSDP2)
                g = g.full_tensor()  # the whole gradient
            grads[f"{i}/{name}"] = g.detach().numpy().copy()  # type: ignore[union-attr]
    # the reference: what autograd computes for this rank's data, then (DDP) averaged across ranks; under
    # FSDP2 what arrives at each parameter's AccumulateGrad, before the reduce-scatter (no optimizer step
    # ran, so the seed's weights are the weights)
    if mode == "fsdp":
        torch.manual_seed(0)
        ref = MLP()
        x, y = batches[-1]
        local = torch.autograd.grad(F.cross_entropy(ref(x), y), list(ref.parameters()))
        for (name, _), g in zip(ref.named_parameters(), local):
            grads[f"ref/local/{name}"] = g.numpy()  # differs by rank: each rank its own data
    else:
        ref = MLP()
        ref.load_state_dict({k.removeprefix("module."): v for k, v in base.state_dict().items()})
        x, y = batches[-1]
        local = torch.autograd.grad(F.cross_entropy(ref(x), y), list(ref.parameters()))
        for (name, _), g in zip(ref.named_parameters(), local):
            if mode == "ddp":
                g = g.clone()
                dist.all_reduce(g)
                g /= world
            grads[f"ref/{name}"] = g.numpy()
    tr.close(30)
    np.savez(out / f"rank{rank}.npz", **grads)
    (out / f"rank{rank}.json").write_text(json.dumps({**info, "names": [n for n, _ in model.named_parameters()],
                                                      "stats": tr.stats}))
    # every rank done before any tears down: rank 0 hosts the rendezvous store, and its exit while the other
    # rank still used it was seen once to abort rank 0 at shutdown ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # written, flushed and the process group destroyed: leave without the interpreter's teardown, where gloo's
    # threads were seen to abort rank 0 at exit ("terminate called without an active exception": once before the
    # barrier above, once after it, in CI on an FSDP2 run); the exit status is then the run's
    sys.stdout.flush()
    os._exit(0)
