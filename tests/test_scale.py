"""Deep graphs: a traced step of an LSTMCell loop unrolled over time is recorded, and its graph let go,
without crashing (NOTE [Teardown] in tracer/record/walk.py), with gradients bitwise equal to a plain
step's.

The crash this guards against needs a graph deep enough to overflow the C stack while torch frees
it: 60k-75k nodes at the default 8 MB. The child process here runs with a 512 KiB stack, where a
graph of 10k nodes is enough (letting go of the same walk's nodes children first crashes there)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys
import torch
import gradscape
from torch import nn

torch.set_num_threads(1)
steps = int(sys.argv[1])


def make():
    torch.manual_seed(0)
    return nn.LSTMCell(4, 32), nn.Linear(32, 1)


def loss_of(cell, head, x, y):
    h = x.new_zeros(8, 32)
    c = x.new_zeros(8, 32)
    outs = []
    for t in range(steps):
        h, c = cell(x[t], (h, c))
        outs.append(head(h))
    return ((torch.stack(outs) - y) ** 2).mean()


g = torch.Generator().manual_seed(1)
x, y = torch.randn(steps, 8, 4, generator=g), torch.randn(steps, 8, 1, generator=g)
cell, head = make()
loss_of(cell, head, x, y).backward()
want = [p.grad.clone() for p in (*cell.parameters(), *head.parameters())]

cell, head = make()
model = nn.ModuleDict({"cell": cell, "head": head})
tr = gradscape.Tracer(model)
with tr.step(0) as st:
    loss_of(cell, head, x, y).backward()  # the loss is gone when the block ends: the walk holds the graph
got = [p.grad for p in (*cell.parameters(), *head.parameters())]
assert all(torch.equal(a, b) for a, b in zip(want, got)), "gradients differ"
assert len(st.nodes) > 10_000, len(st.nodes)
assert st.nodes[0].grad_outputs is not None
print("nodes", len(st.nodes))
"""


def _small_stack() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    limit = 512 * 1024
    resource.setrlimit(resource.RLIMIT_STACK, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def test_a_deep_graph_is_traced_and_let_go_without_crashing() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD, "600"], capture_output=True, text=True, timeout=600,
                         cwd=ROOT, preexec_fn=_small_stack, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-3000:]}"
    nodes = int(out.stdout.split()[-1])
    assert nodes > 10_000
