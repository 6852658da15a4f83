"""One rank of a 2-process DistributedDataParallel run (gloo, CPU); run by tests/test_distributed.py as
a subprocess with MASTER_ADDR/MASTER_PORT set. Writes what it saw to `<out>/rank<r>.npz` and `.json`."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from zoo import RankMLP as MLP

import gradscape


def main() -> None:
    rank, world, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    base = MLP()
    twin = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data: rank-local gradients differ
    x, y = torch.randn(8, 3, generator=gen), torch.randint(0, 2, (8,), generator=gen)
    local = torch.autograd.grad(F.cross_entropy(base(x), y), list(base.parameters()))  # before any all-reduce

    plain = DistributedDataParallel(twin)
    F.cross_entropy(plain(x), y).backward()

    model = DistributedDataParallel(base)
    tr = gradscape.Tracer(model, tensors="full")
    with tr.step(0) as st:
        F.cross_entropy(model(x), y).backward()
    assert st is not None
    arrays: dict[str, np.ndarray] = {}
    names = [n for n, _ in model.named_parameters()]
    for k, ((name, p), (_, q)) in enumerate(zip(model.named_parameters(), plain.named_parameters())):
        node = st.param_node(name)
        arrays[f"params/{name}"] = st.params[name].values  # type: ignore[assignment]
        arrays[f"grad/{name}"] = p.grad.numpy()  # type: ignore[union-attr]
        arrays[f"untraced/{name}"] = q.grad.numpy()  # type: ignore[union-attr]
        arrays[f"local/{name}"] = local[k].numpy()
        arrays[f"arrived/{name}"] = node.grad_outputs[0].values  # type: ignore[union-attr,index,assignment]
    np.savez(out / f"rank{rank}.npz", **arrays)
    info = {"names": names, "rank": st.rank, "world_size": st.world_size, "error": st.error,
            "modules": {n.name: n.module for n in st.nodes if n.kind == "op"}}
    (out / f"rank{rank}.json").write_text(json.dumps(info))
    tr.close()
    dist.barrier()  # every rank done before rank 0, which hosts the rendezvous store, tears down (ddp_stream_worker.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # written, flushed and the process group destroyed: leave without the interpreter's teardown, where gloo's
    # threads were seen to abort rank 0 at exit ("terminate called without an active exception": once before the
    # barrier above, once after it, in CI on an FSDP2 run); the exit status is then the run's
    sys.stdout.flush()
    os._exit(0)
