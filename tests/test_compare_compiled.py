"""`Tracer.compare_compiled` (NOTE [Compare compiled] in tracer/record/compare.py): the differences it records
equal the ones computed here from torch's own gradients, and training is left as the compiled run left it.

The compiled model runs under a backend that computes its graph in float64 and rounds the results back to
float32: its gradients differ from the eager ones by rounding, deterministically (inductor's do too, but
not predictably: the slow test below runs it)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradscape

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo's own notes on what it compiles


def in_float64(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """A dynamo backend: the graph's floating-point inputs in float64, its outputs rounded back."""

    def run(*args: Any) -> Any:
        outs = gm(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args])
        return type(outs)(o.float() if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outs)

    return run


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 32)
        self.bn = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.tanh(self.bn(self.fc1(x)))).softmax(-1).log())


def loss_of(model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.nll_loss(model(x), y)


def step(model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The closure's body: forward and backward, returning the loss."""
    loss = loss_of(model, x, y)
    loss.backward()
    return loss


def expected(c: torch.Tensor, e: torch.Tensor) -> tuple[float, float, list[int]]:
    """max |c − e|, max |c − e| / max(|e|, tiny) and where |c − e| is largest, in float64 with numpy."""
    c64, e64 = c.detach().double().numpy(), e.detach().double().numpy()
    diff = np.abs(c64 - e64)
    rel = diff / np.maximum(np.abs(e64), np.finfo(np.float32).tiny)
    return float(diff.max()), float(rel.max()), [int(k) for k in np.unravel_index(diff.argmax(), diff.shape)]


def test_recorded_differences_are_the_ones_torch_gives(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    twin = copy.deepcopy(model)  # trained without gradscape, the same way
    cm, ctwin = torch.compile(model, backend=in_float64), torch.compile(twin, backend=in_float64)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    params = dict(model.named_parameters())
    for p in params.values():  # a gradient held from an earlier micro-batch: the step's is added to it
        p.grad = torch.full_like(p, 0.5)
    for p in twin.parameters():
        p.grad = torch.full_like(p, 0.5)

    torch.manual_seed(7)
    state = torch.get_rng_state()
    c_ref = dict(zip(params, torch.autograd.grad(loss_of(cm, x, y), list(params.values()))))
    torch.set_rng_state(state)
    e_ref = dict(zip(params, torch.autograd.grad(loss_of(model, x, y), list(params.values()))))
    with torch.no_grad():
        for b, tb in zip(model.buffers(), twin.buffers()):
            b.copy_(tb)  # the reference runs moved BatchNorm's statistics: back to the twin's

    torch.set_rng_state(state)
    loss_of(ctwin, x, y).backward()  # the twin's compiled step
    twin_rng = torch.rand(3)
    torch.set_rng_state(state)
    path = tmp_path / "trace.sqlite"
    with gradscape.Tracer(model, sink=path) as tr:
        st = tr.compare_compiled(4, lambda: step(cm, x, y))
        rng = torch.rand(3)

    got = st.meta["compare_compiled"]
    assert set(got["params"]) == set(params)
    differs = 0
    for name in params:
        max_abs, max_rel, at = expected(c_ref[name], e_ref[name])
        rec = got["params"][name]
        assert (rec["max_abs"], rec["max_rel"], rec["at"]) == (max_abs, max_rel, at), name
        assert rec["compiled"] == float(c_ref[name][tuple(at)]) and rec["eager"] == float(e_ref[name][tuple(at)])
        differs += max_abs > 0
    assert differs >= 3  # the backend's rounding shows (the test could not fail otherwise)
    assert got["worst"] == max(params, key=lambda n: expected(c_ref[n], e_ref[n])[0])
    # the trace is the eager run's, op by op, and its gradients are the eager ones
    assert st.meta["compiled"] == "eager" and not [n for n in st.nodes if n.kind == "compiled"]
    assert {n.module for n in st.nodes} >= {"fc1", "bn", "drop", "fc2"}
    # training: what the compiled run left, bit for bit that of the twin trained without gradscape
    assert torch.equal(rng, twin_rng)
    for (name, p), tp in zip(params.items(), twin.parameters()):
        assert torch.equal(p.grad, tp.grad), name
    for b, tb in zip(model.buffers(), twin.buffers()):
        assert torch.equal(b, tb)
    assert tr.history[-1]["step"] == 4 and tr.history[-1]["loss"] == pytest.approx(got["loss"]["compiled"])
    back = gradscape.load(path, run=tr.run, step=4)  # the trace file keeps both (the wire's meta)
    assert back.meta["compare_compiled"] == got and back.meta["compiled"] == "eager"


def test_a_closure_that_steps_an_optimizer_is_refused() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure() -> None:
        model(torch.randn(4, 3)).sum().backward()
        opt.step()

    with gradscape.Tracer(model) as tr, pytest.raises(RuntimeError, match="changed a parameter"):
        tr.compare_compiled(0, closure)


def test_a_nan_difference_is_written_as_text() -> None:
    from gradscape.tracer.record.compare import param_difference

    d = param_difference(torch.tensor([1.0, math.nan, 2.0]), torch.tensor([1.0, 0.0, 2.5]))
    assert d["max_abs"] == "inf" and d["max_rel"] == "inf" and d["at"] == [1] and d["compiled"] == "nan"
