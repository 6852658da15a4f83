"""Each awkward situation a real training loop produces, traced without breaking it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from zoo import SmallCNN, Tied, TinyTransformer, build

import gradscape


def _vals(t: gradscape.TensorTrace | None) -> np.ndarray:
    assert t is not None and t.values is not None
    return t.values


def _names(st: gradscape.StepTrace) -> list[str]:
    return [n.name for n in st.nodes]


def test_inplace_relu_batchnorm_conv() -> None:
    case = build("cnn")
    tr = gradscape.Tracer(case.model)
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    names = _names(st)
    assert "NativeBatchNormBackward0" in names and "ReluBackward0" in names
    assert "BackwardHookFunctionBackward" not in names  # no full hooks were put on the model
    bn = st.modules["bn1"]
    assert bn.grad_output[0] is not None and bn.grad_output[0].shape == (4, 4, 8, 8)
    relu = st.by_name("ReluBackward0")
    assert any(n.module == "relu" for n in relu)
    assert all(n.order is not None for n in st.nodes)
    (bnode,) = st.by_name("NativeBatchNormBackward0")
    assert bnode.input_labels[1:] == ["weight → bn1.weight", "bias → bn1.bias"]


def test_layernorm_embedding_attention_are_attributed() -> None:
    torch.manual_seed(0)
    model = TinyTransformer()
    tok = torch.randint(0, 11, (2, 5))
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        out = model(tok)
        F.cross_entropy(out.reshape(-1, 11), tok.reshape(-1)).backward()
    mods = {n.module for n in st.nodes}
    assert {"emb", "attn", "ln1", "ln2", "ff.0", "ff.1", "ff.2", "head"} <= mods
    (emb,) = st.by_name("EmbeddingBackward0")
    assert emb.input_labels == ["weight → emb.weight"]
    assert any(n.name == "NativeLayerNormBackward0" and n.module == "ln1" for n in st.nodes)
    assert all(n.source and n.source.startswith(("zoo.py:", "test_cases.py:"))
               for n in st.nodes if n.kind == "op")
    assert set(st.params) == {n for n, _ in model.named_parameters()}
    assert st.modules["attn"].grad_input[0] is not None  # through the attention only


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * 2  # tanh and mul written in _Inner's own forward


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()
        self.shared = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.shared(x)
        h = h + self.inner(h)  # residual add: the root's own op, behind a child's output
        return self.shared(h).sum()  # `shared` called a second time


def test_every_node_is_attributed_to_the_innermost_module_call() -> None:
    model = _Outer()
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        model(torch.randn(3, 4)).backward()
    got = sorted((n.name, n.module) for n in st.nodes if n.kind == "op")
    want = sorted([
        ("AddmmBackward0", "shared"), ("TBackward0", "shared"),  # first call of shared
        ("AddmmBackward0", "inner.fc"), ("TBackward0", "inner.fc"),
        ("TanhBackward0", "inner"), ("MulBackward0", "inner"),
        ("AddBackward0", "<root>"),
        ("AddmmBackward0", "shared"), ("TBackward0", "shared"),  # second call of shared
        ("SumBackward0", "<root>"),
    ])
    assert got == want
    assert len(st.modules["shared"].calls) == 2
    assert all(n.module is None for n in st.nodes if n.kind in ("param", "leaf"))


def test_shared_weights_are_named_and_summed() -> None:
    torch.manual_seed(0)
    model = Tied()
    tok = torch.randint(0, 7, (3, 4))
    tr = gradscape.Tracer(model, tensors="full")
    with tr.step(0) as st:
        model(tok).pow(2).mean().backward()
    emb_nodes = [n for n in st.nodes if n.param == "emb.weight"]
    assert len(emb_nodes) == 1  # one AccumulateGrad, fed by two paths
    producers = [e for e in st.edges if e[1] == emb_nodes[0].id]
    assert len(producers) == 2
    assert np.allclose(_vals(st.params["emb.weight"]), model.emb.weight.grad.numpy(), atol=1e-7)
    assert len(st.modules["mix"].calls) == 2  # the Linear is called twice


def test_two_losses_two_backward_calls() -> None:
    case = build("two_heads")
    model = case.model
    x, y = case.batch
    tr = gradscape.Tracer(model, tensors="full")
    with tr.step(0) as st:
        a, b = model(x)
        F.cross_entropy(a, y).backward(retain_graph=True)
        b.pow(2).mean().backward()
    assert len(st.passes) == 2
    body_w = st.param_node("body.weight")
    assert body_w is not None and len(body_w.runs) == 2  # reached by both losses
    assert np.allclose(_vals(st.params["body.weight"]), model.body.weight.grad.numpy(), atol=1e-6)
    # each node of the first pass ran before any node of the second
    first, second = st.passes
    assert first.end == second.start and second.end == len(st.execution)


def test_detached_branch_has_no_edge_back() -> None:
    case = build("detached")
    tr = gradscape.Tracer(case.model)
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    gate_mm = [n for n in st.nodes if n.module == "gate" and n.name == "AddmmBackward0"]
    assert len(gate_mm) == 1
    assert gate_mm[0].grad_inputs[1] is None and gate_mm[0].input_labels[1] == "mat1 → no gradient needed"


def test_retain_graph_twice_records_two_runs() -> None:
    case = build("mlp")
    tr = gradscape.Tracer(case.model, tensors="full")
    with tr.step(0) as st:
        loss = case.loss(case.model, case.batch)
        loss.backward(retain_graph=True)
        loss.backward()
    assert len(st.passes) == 2 and st.passes[0].retain_graph and not st.passes[1].retain_graph
    assert all(len(n.runs) == 2 for n in st.nodes)
    w = case.model.fc1.weight.grad
    assert np.allclose(_vals(st.params["fc1.weight"]), w.numpy(), atol=1e-7)  # the sum of both passes
    n0 = st.nodes[2]
    assert np.array_equal(_vals(n0.runs[0].grad_outputs[0]), _vals(n0.runs[1].grad_outputs[0]))


def test_create_graph_double_backward() -> None:
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    tr = gradscape.Tracer(tensors="full")
    with tr.step(0) as st:
        y = (x ** 3).sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        g.sum().backward()
    assert x.grad is not None and x.grad.tolist() == [6.0, 12.0, 18.0]
    assert len(st.passes) == 2 and st.passes[0].create_graph
    first = {st.nodes[i].name for i in st.passes[0].roots}
    assert first == {"SumBackward0"}
    second_nodes = {n.name for n in st.nodes if any(r.pass_index == 1 for r in n.runs)}
    assert "MulBackward0" in second_nodes  # the backward-of-backward graph is new nodes
    (pow_node,) = [n for n in st.by_name("PowBackward0") if n.runs[0].pass_index == 0]
    assert _vals(pow_node.grad_inputs[0]).tolist() == [3.0, 12.0, 27.0]


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint(reentrant: bool) -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    head = nn.Linear(4, 1)
    model = nn.ModuleDict({"block": block, "head": head})
    x = torch.randn(3, 4, requires_grad=True)
    tr = gradscape.Tracer(model, tensors="full")
    with tr.step(0) as st:
        h = checkpoint(block, x, use_reentrant=reentrant)
        head(h).sum().backward()
    names = _names(st)
    if reentrant:
        assert "CheckpointFunctionBackward" in names and "TanhBackward0" not in names
        (ck,) = [n for n in st.nodes if n.kind == "checkpoint"]
        assert ck.input_labels[0].startswith("checkpointed fn arg 0")
        assert np.allclose(_vals(ck.grad_inputs[0]), x.grad.numpy(), atol=1e-6)
        # parameters inside the checkpoint have no edge in the outer graph, yet their gradients are kept
        assert np.allclose(_vals(st.params["block.0.weight"]), block[0].weight.grad.numpy(), atol=1e-6)
        assert st.param_node("block.0.weight") is None
    else:
        assert "TanhBackward0" in names and "CheckpointFunctionBackward" not in names
        tanh = st.by_name("TanhBackward0")[0]
        assert tanh.module == "block.1"
        assert np.allclose(_vals(st.params["block.0.weight"]), block[0].weight.grad.numpy(), atol=1e-6)
    assert x.grad is not None


def test_custom_function_slots_are_its_tensor_args() -> None:
    case = build("custom")
    tr = gradscape.Tracer(case.model, tensors="full")
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    (node,) = [n for n in st.nodes if n.kind == "custom"]
    assert node.name == "ScaledSquareBackward"
    # forward(ctx, a, k, b): the slots are the tensor args a and b, but the node does not say which
    # forward args were tensors (k is a float), so the names cannot be matched to slots: `input j`
    assert node.input_args == ["input 0", "input 1"]
    assert node.input_labels[1].endswith("→ w")


class _Mul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return g * b, g * a


def test_custom_function_with_only_tensor_args_names_its_slots() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    x = torch.arange(3.0, requires_grad=True)
    st = gradscape.trace(_Mul.apply(x, w).sum())
    (node,) = [n for n in st.nodes if n.kind == "custom"]
    assert node.input_args == ["a", "b"]


def test_bf16_autocast_on_cpu() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    tr = gradscape.Tracer(model)
    with tr.step(0) as st, torch.autocast("cpu", dtype=torch.bfloat16):
        model(x).float().pow(2).mean().backward()
    assert "ToCopyBackward0" in _names(st)
    dtypes = {g.dtype for n in st.nodes for g in (n.grad_outputs or []) if g is not None}
    assert {"bfloat16", "float32"} <= dtypes
    assert all(st.params[k].dtype == "float32" for k in st.params)
    (first_addmm,) = [n for n in st.nodes if n.name == "AddmmBackward0" and n.module == "0"]
    assert first_addmm.input_labels[2] == "mat2 → 0.weight (transposed, cast)"
    for t in st.params.values():
        assert np.isfinite(t.stats["norm"]) and t.thumb is not None


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compiled_submodule_is_one_opaque_node() -> None:
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    model = nn.Module()
    model.block = torch.compile(inner, backend="aot_eager")
    model.head = nn.Linear(4, 2)
    x = torch.randn(5, 4)
    model.head(model.block(x)).sum().backward()  # compile once, outside the tracer
    for p in model.parameters():
        p.grad = None
    tr = gradscape.Tracer(model, compiled="opaque")  # (the default runs it eagerly: tests/test_compiled.py)
    with tr.step(0) as st:
        model.head(model.block(x)).sum().backward()
    compiled = [n for n in st.nodes if n.kind == "compiled"]
    assert len(compiled) == 1
    node = compiled[0]
    assert node.name == "CompiledFunctionBackward" and node.module == "block"
    assert not st.by_name("ReluBackward0")  # no per-op nodes inside it
    params = {st.nodes[d].param for s, d, _ in st.edges if s == node.id}
    assert params == {"block.0.weight", "block.0.bias", "block.2.weight", "block.2.bias"}  # as the model names them
    assert all("compiled block" in lab for lab in node.input_labels)


def test_ten_thousand_op_chain() -> None:
    x = torch.ones(3, requires_grad=True)
    tr = gradscape.Tracer(thumb=0)
    with tr.step(0) as st:
        h = x
        for _ in range(10_000):
            h = h * 1.0001
        h.sum().backward()
    assert len(st.nodes) == 10_002
    assert st.nodes[-1].order == 10_001
    assert x.grad is not None


def test_forward_of_a_module_called_outside_any_model() -> None:
    """model=None still records ops and gradients; nodes just carry no module names."""
    tr = gradscape.Tracer()
    cnn = SmallCNN()
    with tr.step(0) as st:
        cnn(torch.randn(2, 1, 8, 8)).sum().backward()
    assert st.nodes and all(n.module is None for n in st.nodes)
    assert all(n.param is None for n in st.nodes)


def test_trace_one_call() -> None:
    case = build("mlp")
    loss = case.loss(case.model, case.batch)
    st = gradscape.trace(loss, case.model)
    assert st.nodes[0].name == "NllLossBackward0"
    assert set(st.params) == {n for n, _ in case.model.named_parameters()}


def test_a_compiled_module_keeps_its_graphs_across_traced_steps() -> None:
    import torch._functorch.config as functorch_config

    # the reference below retains the graph, which a compiled backward with donated buffers refuses (torch 2.9
    # donates them here once an earlier test has compiled; the traced step itself retains nothing). torch's own
    # `config.patch` restores the setting: a monkeypatch deleted it on undo, hiding it from every later compile
    with functorch_config.patch(donated_buffer=False):
        _compiled_module_keeps_its_graphs()


def _compiled_module_keeps_its_graphs() -> None:
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(0)
    counter = CompileCounterWithBackend("aot_eager")
    model = nn.Module()
    model.block = torch.compile(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4)), backend=counter)
    model.head = nn.Linear(4, 2)
    x = torch.randn(5, 4)
    model.head(model.block(x)).sum().backward()  # compiled once, untraced
    assert counter.frame_count == 1
    model.zero_grad()
    tr = gradscape.Tracer(model, compiled="opaque")
    for i in range(12):  # past dynamo's recompile limit (8), had every traced step recompiled
        with tr.step(i) as st:
            loss = model.head(model.block(x)).sum()
            want = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
            loss.backward()
        compiled = [n for n in st.nodes if n.kind == "compiled"]
        assert len(compiled) == 1 and compiled[0].module == "block", i  # still compiled, and attributed
        got = [p.grad for p in model.parameters()]
        assert all(torch.equal(g, w) for g, w in zip(got, want)), i
        for p in model.parameters():
            p.grad = None
    assert counter.frame_count == 2  # one more compile for the traced steps, then both graphs are kept
    model.head(model.block(x)).sum().backward()  # untraced again: the first graph
    assert counter.frame_count == 2
