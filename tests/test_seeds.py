"""The worked examples of the people in shared/seeds, as tests."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from zoo import SeedMLP

import gradscape


def _vals(t: gradscape.TensorTrace | None) -> np.ndarray:
    assert t is not None and t.values is not None
    return t.values


def test_seed002_backward_with_gradient() -> None:
    """out = x @ a; out.backward(g): each node sees what arrives and sends on a VJP."""
    x = torch.ones(2, 3, requires_grad=True)
    a = torch.ones(3, 4)
    g = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8]])
    tr = gradscape.Tracer(tensors="full")
    with tr.step(0) as st:
        out = torch.mm(x, a)
        out.backward(g)
    assert x.grad is not None and x.grad.tolist() == [[10, 10, 10], [26, 26, 26]]
    mm, acc = st.nodes
    assert mm.name == "MmBackward0" and acc.name == "torch::autograd::AccumulateGrad"
    assert _vals(mm.grad_outputs[0]).tolist() == g.tolist()          # the supplied gradient arrives
    assert _vals(mm.grad_inputs[0]).tolist() == [[10, 10, 10], [26, 26, 26]]
    assert mm.grad_inputs[1] is None                                # a needs no grad
    assert mm.input_labels[0].startswith("self → leaf tensor [2×3]")
    assert mm.input_labels[1] == "mat2 → no gradient needed"
    assert _vals(acc.grad_outputs[0]).tolist() == [[10, 10, 10], [26, 26, 26]]
    assert st.passes[0].api == "Tensor.backward"
    assert _vals(st.passes[0].root_grads[0]).tolist() == g.tolist()
    assert [st.nodes[i].name for i in st.order] == ["MmBackward0", "torch::autograd::AccumulateGrad"]


def test_seed003_autograd_grad_with_grad_outputs() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    tr = gradscape.Tracer(tensors="full")
    with tr.step(0) as st:
        y = torch.outer(x, x)
        (gx,) = torch.autograd.grad(y, x, grad_outputs=torch.ones_like(y))
    assert gx.tolist() == [20, 20, 20, 20]
    names = [n.name for n in st.nodes]
    assert names == ["MulBackward0", "ViewBackward0", "torch::autograd::AccumulateGrad"]
    mul, view, acc = st.nodes
    assert _vals(mul.grad_outputs[0]).tolist() == np.ones((4, 4)).tolist()
    assert _vals(mul.grad_inputs[0]).reshape(-1).tolist() == [10, 10, 10, 10]  # via the [4,1] view
    assert _vals(mul.grad_inputs[1]).tolist() == [10, 10, 10, 10]
    assert _vals(view.grad_outputs[0]).shape == (4, 1)
    assert acc.order is None  # autograd.grad returns the leaf's gradient; AccumulateGrad does not run
    assert st.passes[0].api == "autograd.grad"
    assert x.grad is None


def test_seed000_slots_at_op_level_and_module_level() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 32, 3)
    fc = nn.Linear(84, 10)
    model = nn.ModuleDict({"conv": conv, "fc": fc})
    xc = torch.randn(64, 16, 16, 16, requires_grad=True)
    xf = torch.randn(64, 84, requires_grad=True)
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        loss = conv(xc).pow(2).mean() + fc(xf).pow(2).mean()
        loss.backward()
    (cnode,) = st.by_name("ConvolutionBackward0")
    assert [g.shape for g in cnode.grad_inputs] == [(64, 16, 16, 16), (32, 16, 3, 3), (32,)]
    assert cnode.input_labels == ["input → input of conv (leaf tensor [64×16×16×16])", "weight → conv.weight",
                                  "bias → conv.bias"]
    assert cnode.grad_outputs[0].shape == (64, 32, 14, 14)
    (addmm,) = st.by_name("AddmmBackward0")
    # the "bias, input, weight" order the deprecated hook showed is addmm(self=bias, mat1=input, mat2=W.T)
    assert [g.shape for g in addmm.grad_inputs] == [(10,), (64, 84), (84, 10)]
    assert addmm.input_labels == ["self → fc.bias", "mat1 → input of fc (leaf tensor [64×84])",
                                  "mat2 → fc.weight (transposed)"]
    assert addmm.module == "fc" and conv and cnode.module == "conv"
    # module level: what full backward hooks mean, with no full hook installed
    assert [g.shape for g in st.modules["conv"].grad_input] == [(64, 16, 16, 16)]
    assert [g.shape for g in st.modules["conv"].grad_output] == [(64, 32, 14, 14)]
    assert [g.shape for g in st.modules["fc"].grad_input] == [(64, 84)]
    assert [g.shape for g in st.modules["fc"].grad_output] == [(64, 10)]
    # the old register_backward_hook fired on the module output's grad_fn: that op's slots
    assert st.modules["fc"].calls[0].last_op == addmm.id
    assert st.modules["conv"].calls[0].last_op == cnode.id


def test_seed004_linear_identities() -> None:
    """gradWeight = Σ_b outer(gradOutput_b, input_b), gradBias = Σ_b gradOutput_b (Lua Torch names)."""
    torch.manual_seed(0)
    lin = nn.Linear(5, 3)
    x = torch.randn(4, 5)
    tr = gradscape.Tracer(lin, tensors="full")
    with tr.step(0) as st:
        y = lin(x)
        y.backward(torch.randn(4, 3))
    (addmm,) = st.by_name("AddmmBackward0")
    grad_output = torch.from_numpy(_vals(addmm.grad_outputs[0]))
    grad_weight = sum(torch.outer(grad_output[b], x[b]) for b in range(4))
    assert torch.allclose(torch.from_numpy(_vals(st.params["weight"])), grad_weight, atol=1e-6)
    assert torch.allclose(torch.from_numpy(_vals(st.params["bias"])), grad_output.sum(0), atol=1e-6)
    assert torch.allclose(lin.weight.grad, grad_weight, atol=1e-6)
    assert torch.allclose(torch.from_numpy(_vals(addmm.grad_inputs[2])), grad_weight.t(), atol=1e-6)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # the reference twin's hook on fc1
def test_seed001_mlp_loop_traced_every_step_matches_full_hooks() -> None:
    """The forum's 3-20-30-2 MLP, traced every step of a real loop. Module grads equal what
    register_full_backward_hook reports on an identical copy of the model."""
    torch.manual_seed(0)
    net = SeedMLP()
    twin = copy.deepcopy(net)
    seen: dict[str, tuple[list[torch.Tensor | None], list[torch.Tensor | None]]] = {}
    handles = [getattr(twin, n).register_full_backward_hook(
        lambda m, gi, go, n=n: seen.__setitem__(n, (list(gi), list(go)))) for n in ("fc1", "fc2", "fc3")]
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    opt_twin = torch.optim.SGD(twin.parameters(), lr=0.1)
    tr = gradscape.Tracer(net, run="seed001", tensors="full", keep=100)
    g = torch.Generator().manual_seed(2)
    for i in range(5):
        x = torch.rand(4, 3, generator=g)
        y = torch.randint(0, 2, (4,), generator=g)
        with tr.step(i) as st:
            loss = F.cross_entropy(net(x), y)
            loss.backward()
        F.cross_entropy(twin(x), y).backward()
        for name in ("fc1", "fc2", "fc3"):
            gi, go = seen[name]
            mt = st.modules[name]
            assert np.allclose(_vals(mt.grad_output[0]), go[0].numpy(), atol=1e-7)
            if gi[0] is None:
                assert mt.grad_input[0] is None  # fc1: the data needs no grad
            else:
                assert np.allclose(_vals(mt.grad_input[0]), gi[0].numpy(), atol=1e-7)
        for pname, p in net.named_parameters():
            assert np.array_equal(_vals(st.params[pname]), p.grad.numpy()), pname
        opt.step()
        opt.zero_grad()
        opt_twin.step()
        opt_twin.zero_grad()
    assert [s.step for s in tr.steps] == [0, 1, 2, 3, 4]
    for h in handles:
        h.remove()
