"""Source lines and modules, checked line by line against this file, and the function mode's state
around library leaf modules (NOTE [Library leaves] in gradscape.tracer.record.forward)."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradscape


def _line(marker: str) -> str:
    """`test_attribution.py:N` of the line of this file that holds `marker`."""
    lines = inspect.getsource(inspect.getmodule(_line)).splitlines()  # type: ignore[arg-type]
    (n,) = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    return f"test_attribution.py:{n}"


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc(x))  # @block-call
        return torch.tanh(h) * 2 + x  # @block-ops


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 4)
        self.block = _Block()
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), _Block())
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)  # @net-inp
        x = self.seq(self.block(x))  # @net-seq
        return self.norm(x).sum(1)  # @net-norm


def _trace(model: nn.Module, x: torch.Tensor) -> gradscape.StepTrace:
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        out = model(x)  # @call
        (out ** 2).mean().backward()  # @loss
    assert st is not None
    return st


def test_every_node_has_the_line_and_module_that_created_it() -> None:
    torch.manual_seed(0)
    st = _trace(_Net(), torch.randn(5, 3))
    got = sorted(((n.module, n.name, n.source) for n in st.nodes if n.kind == "op"), key=repr)
    L = _line
    want = sorted([
        ("inp", "AddmmBackward0", L("@net-inp")),
        ("block.fc", "AddmmBackward0", L("@block-call")),
        ("block.act", "GeluBackward0", L("@block-call")),
        ("block", "TanhBackward0", L("@block-ops")),
        ("block", "MulBackward0", L("@block-ops")),
        ("block", "AddBackward0", L("@block-ops")),
        ("seq.0", "AddmmBackward0", L("@net-seq")),
        ("seq.1", "ReluBackward0", L("@net-seq")),
        ("seq.2.fc", "AddmmBackward0", L("@block-call")),
        ("seq.2.act", "GeluBackward0", L("@block-call")),
        ("seq.2", "TanhBackward0", L("@block-ops")),
        ("seq.2", "MulBackward0", L("@block-ops")),
        ("seq.2", "AddBackward0", L("@block-ops")),
        ("norm", "NativeLayerNormBackward0", L("@net-norm")),
        ("<root>", "SumBackward1", L("@net-norm")),
        (None, "PowBackward0", L("@loss")),
        (None, "MeanBackward0", L("@loss")),
    ], key=repr)
    # a Linear's bias broadcast or weight transpose may add nodes: compare the ones listed
    assert [g for g in got if g[:2] in {w[:2] for w in want}] == want, got


def test_a_library_leaf_that_raises_gives_the_mode_back() -> None:
    """A raising nn.Linear (wrong shape) is followed by plain tensor code with no module call: the
    mode is back, so that code still gets source lines and its backward is traced."""
    lin = nn.Linear(3, 2)
    w = torch.randn(3, requires_grad=True)
    tr = gradscape.Tracer(lin)
    with tr.step(0) as st:
        depth = torch._C._len_torch_function_stack()
        with pytest.raises(RuntimeError):
            lin(torch.randn(4, 5))
        assert torch._C._len_torch_function_stack() == depth
        (w * 3).sum().backward()  # @after-raise
    assert torch._C._len_torch_function_stack() == 0
    assert st is not None and len(st.passes) == 1
    (mul,) = st.by_name("MulBackward0")
    assert mul.source == _line("@after-raise")
    assert torch.equal(w.grad, torch.full((3,), 3.0))


def test_a_user_mode_above_ours_sees_a_library_leaf_and_ours_stays() -> None:
    seen: list[object] = []

    class Counting(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(func)
            return func(*args, **(kwargs or {}))  # @user-handler

    lin = nn.Linear(3, 2)
    tr = gradscape.Tracer(lin, monitor=False)  # the tracer's mode alone
    with tr.step(0) as st:
        with Counting():
            out = lin(torch.randn(4, 3))  # @user-mode
            assert torch._C._len_torch_function_stack() == 2
        out.sum().backward()
    assert F.linear in seen
    # our mode ran the op for the user's mode, so the first frame outside torch is the user's handler
    (addmm,) = st.by_name("AddmmBackward0")  # type: ignore[union-attr]
    assert addmm.source == _line("@user-handler") and addmm.module == "<root>"


def test_user_forward_pre_hook_on_a_library_leaf_keeps_working() -> None:
    """A user's own pre-hook on a leaf runs while the mode is aside; what it computes is attributed
    to the leaf's call, and the mode is back after the call."""
    lin = nn.Linear(3, 3)
    handle = lin.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    try:
        tr = gradscape.Tracer(lin, monitor=False)  # the tracer's mode alone
        x = torch.randn(2, 3, requires_grad=True)
        with tr.step(0) as st:
            y = lin(x)  # @hooked
            assert torch._C._len_torch_function_stack() == 1
            y.sum().backward()
    finally:
        handle.remove()
    assert st is not None
    (mul,) = st.by_name("MulBackward0")
    assert mul.source == _line("@hooked") and mul.module == "<root>"
    assert torch.allclose(x.grad, 2 * lin.weight.sum(0).detach().expand(2, 3))


def test_a_loss_module_outside_the_model_gets_its_line() -> None:
    """`criterion = nn.MSELoss()` is no part of the model: its call is not recorded as a module call,
    yet it is a library leaf, so its ops get the line that called it and the mode is back after."""
    lin = nn.Linear(3, 2)
    criterion = nn.MSELoss()
    tr = gradscape.Tracer(lin, monitor=False)  # the tracer's mode alone
    with tr.step(0) as st:
        out = lin(torch.randn(4, 3))
        loss = criterion(out, torch.zeros(4, 2))  # @criterion
        assert torch._C._len_torch_function_stack() == 1
        (loss * 2).backward()  # @times-two
    assert st is not None
    (mse,) = st.by_name("MseLossBackward0")
    assert mse.source == _line("@criterion") and mse.module is None
    (mul,) = st.by_name("MulBackward0")
    assert mul.source == _line("@times-two")
    assert set(st.modules) == {"<root>"}


class _FFLayer(nn.Linear):
    """The forward-forward example's layer: trained on its own, its forward called directly."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__(n_in, n_out)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x / (x.norm(2, 1, keepdim=True) + 1e-4)  # @ff-norm
        return self.act(torch.mm(d, self.weight.T) + self.bias.unsqueeze(0))  # @ff-out


def _scaled(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return layer.forward(x) * 3  # @helper


class _Wrapper(nn.Module):
    """Calls its inner module's forward itself (a wrapper that bypasses `__call__`), through a helper."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _FFLayer(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scaled(self.inner, x) - 1  # @wrapper


def test_direct_forward_calls_are_attributed_node_by_node() -> None:
    """`layer.forward(x)` opens no hook window; each of its ops still belongs to the module whose forward
    ran it, exactly as the same layer class called through `__call__` (layers.0 here), also nested (a
    wrapper called through `__call__` that calls its inner module's forward through a helper)."""
    torch.manual_seed(0)
    net = nn.Module()
    net.layers = nn.ModuleList([_FFLayer(4, 6), _FFLayer(6, 6)])
    net.wrap = _Wrapper()
    tr = gradscape.Tracer(net)
    with tr.step(0) as st:
        h = net.layers[0](torch.randn(5, 4, requires_grad=True))  # through __call__
        g = net.layers[1].forward(h)  # directly
        out = net.wrap(g)
        (out ** 2).mean().backward()  # @ff-loss
    assert st is not None
    ops = [n for n in st.nodes if n.kind == "op"]
    by = {m: sorted((n.name, n.source) for n in ops if n.module == m)
          for m in ("layers.0", "layers.1", "wrap.inner", "layers.0.act", "layers.1.act", "wrap.inner.act")}
    assert by["layers.0"] and by["layers.0"] == by["layers.1"] == by["wrap.inner"], by
    assert {s for _, s in by["layers.0"]} == {_line("@ff-norm"), _line("@ff-out")}
    assert ("MmBackward0", _line("@ff-out")) in by["layers.1"]
    for m in ("layers.0.act", "layers.1.act", "wrap.inner.act"):
        assert by[m] == [("ReluBackward0", _line("@ff-out"))], m
    assert sorted((n.name, n.source) for n in ops if n.module == "wrap") == [
        ("MulBackward0", _line("@helper")), ("SubBackward0", _line("@wrapper"))]
    assert sorted(n.name for n in ops if n.module is None) == ["MeanBackward0", "PowBackward0"]
    assert all(n.source == _line("@ff-loss") for n in ops if n.module is None)
    for p in net.parameters():  # what autograd computed is untouched
        assert p.grad is not None and torch.isfinite(p.grad).all()
