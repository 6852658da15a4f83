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

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys
import torch
import gradscape
from torch import nn

torch.set_num_threads(1)
steps = int(sys.argv[1])
sink = sys.argv[3] if len(sys.argv) > 3 else None


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
tr = gradscape.Tracer(model, sink=sink, recorder=sys.argv[2])
with tr.step(0) as st:
    loss_of(cell, head, x, y).backward()  # the loss is gone when the block ends: the walk holds the graph
tr.close()
got = [p.grad for p in (*cell.parameters(), *head.parameters())]
assert all(torch.equal(a, b) for a, b in zip(want, got)), "gradients differ"
assert st.meta["recorder"] == sys.argv[2], st.meta
assert len(st.nodes) > 10_000, len(st.nodes)
assert st.nodes[0].grad_outputs is not None
for name, p in model.named_parameters():
    print("norm", name, float(p.grad.double().norm()))
print("nodes", len(st.nodes))
"""

READ_BACK = r"""
import sys
import gradscape
st = gradscape.load(sys.argv[1])
for name, t in st.params.items():
    print("norm", name, t.stats["norm"])
print("nodes", len(st.nodes), len(st.edges))
"""


def _small_stack() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    limit = 512 * 1024
    resource.setrlimit(resource.RLIMIT_STACK, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _run(*args: str, small_stack: bool = True) -> str:
    out = subprocess.run([sys.executable, "-c", *args], capture_output=True, text=True, timeout=600, cwd=ROOT,
                         preexec_fn=_small_stack if small_stack else None, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-3000:]}"
    return out.stdout


def _norms(stdout: str) -> dict[str, float]:
    return {w[1]: float(w[2]) for w in (line.split() for line in stdout.splitlines()) if w and w[0] == "norm"}


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_a_deep_graph_is_traced_and_let_go_without_crashing(recorder: str) -> None:
    out = _run(CHILD, "600", recorder)
    nodes = int(out.split()[-1])
    assert nodes > 10_000


@pytest.mark.slow
def test_a_100k_node_step_is_traced_written_and_read_back_with_default_limits(tmp_path: Path) -> None:
    """A 100k-node step (6,667 steps of the loop) in processes with the default stack and recursion
    limits: traced into a trace file, then read back by another process."""
    path = str(tmp_path / "deep.sqlite")
    traced = _run(CHILD, "6667", "native", path, small_stack=False)
    assert int(traced.split()[-1]) > 100_000
    back = _run(READ_BACK, path, small_stack=False)
    nodes, edges = (int(v) for v in back.split()[-2:])
    assert nodes == int(traced.split()[-1]) and edges >= nodes - 1
    want, got = _norms(traced), _norms(back)  # what the engine left in p.grad, and what the file holds
    assert want.keys() == got.keys() and len(want) == 6
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-5), name
