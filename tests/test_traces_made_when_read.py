"""A natively recorded step's parameter gradients (`st.params`, `OptimizerStep.grads`) and roots' gradients
(`BackwardPass.root_grads`) are rows of its tensor table, made `TensorTrace`s when first read (NOTE [Traces made
when read] in tracer/record/lazy_traces.py). Checked: nothing is made before it is read; what is read is the
gradient the optimizer stepped with (cloned by the test in its pre-hook) and the gradient each backward started
from; the containers compare equal to the dictionary and list they stand for, and a step written to a trace file
reads back the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import gradscape
from gradscape.tracer.record import native
from gradscape.tracer.record.lazy_traces import TableList, TableTraces

pytestmark = pytest.mark.skipif(native.extension() is None, reason="the native recorder is not built")


def _layers() -> tuple[nn.ModuleList, list[torch.optim.Optimizer], torch.Tensor]:
    torch.manual_seed(0)
    layers = nn.ModuleList([nn.Linear(6, 8), nn.Linear(8, 8)])
    return layers, [torch.optim.SGD(layer.parameters(), lr=0.1) for layer in layers], torch.randn(5, 6)


def _step(layers: nn.ModuleList, opts: list[torch.optim.Optimizer], x: torch.Tensor,
          used: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    """Layer-local training, two backward calls and two optimizer steps; each step's gradients cloned as it
    starts (`used`); the roots' gradients each backward was given."""
    roots = []
    h = x
    for k, (layer, opt) in enumerate(zip(layers, opts)):
        names = {id(p): f"{k}.{n}" for n, p in layer.named_parameters()}
        hook = opt.register_step_pre_hook(lambda o, a, kw, names=names: used.append(
            {names[id(p)]: p.grad.detach().clone() for g in o.param_groups for p in g["params"]}))
        out = torch.relu(layer(h))
        opt.zero_grad()
        seed = torch.full_like(out, 0.5 + k)  # `backward(gradient)`: the root's gradient is this
        out.backward(seed)
        roots.append(seed)
        opt.step()
        hook.remove()
        h = out.detach()
    return roots


def _close(trace: gradscape.TensorTrace, t: torch.Tensor) -> None:
    assert list(trace.shape) == list(t.shape)
    np.testing.assert_allclose(trace.stats["norm"], float(torch.linalg.vector_norm(t)), rtol=1e-5)
    np.testing.assert_allclose(trace.stats["mean"], float(t.mean()), rtol=1e-5, atol=1e-7)


def _traced_steps(n: int = 3) -> tuple[gradscape.Tracer, list[dict[str, torch.Tensor]], list[torch.Tensor]]:
    layers, opts, x = _layers()
    tr = gradscape.Tracer(layers, every=1, tensors="summary")
    used: list[dict[str, torch.Tensor]] = []
    roots: list[torch.Tensor] = []
    for i in range(n):  # (the later steps carried: NOTE [Carried forwards])
        used.clear()
        with tr.step(i):
            roots = _step(layers, opts, x, used)
    return tr, used, roots


def test_nothing_is_made_before_it_is_read_and_what_is_read_is_what_was_used() -> None:
    tr, used, roots = _traced_steps()
    st = tr.last
    assert st is not None and st.meta.get("recorder") == "native"
    table = st.nodes.tables.tensors  # type: ignore[attr-defined]
    assert isinstance(st.params, TableTraces) and isinstance(st.passes[0].root_grads, TableList)
    held = len(table.held())  # (the problem finder reads some nodes' slots: a ReLU's)
    got = {name: st.params[name] for name in st.params}  # read now
    assert len(table.held()) == held + 4, "made before anything read them"
    want = {**used[0], **used[1]}
    assert list(got) == ["0.weight", "0.bias", "1.weight", "1.bias"]  # the model's order
    for name, g in want.items():
        _close(got[name], g)
    for o, u in zip(st.optimizer_steps, used):
        assert sorted(o.grads) == sorted(u)
        for name in u:
            assert o.grads[name] is got[name]  # one row, one object
    for p, seed in zip(st.passes, roots):
        [root] = p.root_grads
        assert root is not None
        _close(root, seed)


@pytest.mark.parametrize("monitor", [True, False])
def test_without_an_optimizer_params_are_made_when_read_and_are_the_grads_the_block_left(monitor: bool) -> None:
    """No optimizer, so no monitor's summaries replace the arrivals (and none at all without the monitor, as
    `gradscape.trace` runs): `st.params` still holds rows, made when read, and each is `p.grad` as the block ended
    (two backward calls: the second adds to the first's)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    x = torch.randn(5, 6)
    tr = gradscape.Tracer(model, every=1, tensors="summary", monitor=monitor)
    for i in range(3):  # (the later steps carried)
        model.zero_grad()
        with tr.step(i) as st:
            model(x).pow(2).mean().backward()
            model(x * 2).sum().backward()
    assert st is not None and st.meta.get("recorder") == "native"
    table = st.nodes.tables.tensors  # type: ignore[attr-defined]
    assert isinstance(st.params, TableTraces)
    held = len(table.held())
    got = dict(st.params.items())
    assert len(table.held()) == held + 4, "made before anything read them"
    assert list(got) == [name for name, _ in model.named_parameters()]
    for name, p in model.named_parameters():
        assert p.grad is not None
        _close(got[name], p.grad)
    assert [p for p in st.problems if p.kind in ("exploding", "vanishing", "no_grad")] == []


def test_they_compare_as_the_dict_and_list_they_stand_for() -> None:
    tr, _, _ = _traced_steps(2)
    st = tr.last
    assert st is not None
    assert st.params == dict(st.params.items()) and dict(st.params.items()) == st.params
    root_grads = st.passes[1].root_grads
    assert root_grads == list(root_grads) and list(root_grads) == root_grads
    assert len(st.params) == 4 and "0.bias" in st.params and "2.bias" not in st.params
    with pytest.raises(KeyError):
        st.params["2.bias"]


def test_a_step_written_and_read_back_has_the_same_gradients(tmp_path: Path) -> None:
    layers, opts, x = _layers()
    path = tmp_path / "trace.sqlite"
    tr = gradscape.Tracer(layers, every=1, tensors="summary", sink=str(path))
    used: list[dict[str, torch.Tensor]] = []
    for i in range(3):
        used.clear()
        with tr.step(i):
            _step(layers, opts, x, used)
    tr.close()
    back = gradscape.load(path, run=tr.run, step=2)
    for name, g in {**used[0], **used[1]}.items():
        _close(back.params[name], g)
    assert [len(p.root_grads) for p in back.passes] == [1, 1]
