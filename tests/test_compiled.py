"""Compiled models on traced steps (NOTE [Compiled regions on a traced step] in tracer/record/compiled.py):
every op of a compiled region is traced, gradients are the eager model's bit for bit, and dynamo
compiles no more often than without gradscape. The references are torch's own (`torch.autograd.grad`
on the eager model, dynamo's compile counter), never the tracer."""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

import gradscape

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo's own notes on what it compiles


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small nanoGPT-like decoder: token and position embeddings, `layers` blocks, a final LayerNorm, a head."""

    def __init__(self, vocab: int = 16, seq: int = 8, d: int = 16, heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def lm_loss(model: Callable[[torch.Tensor], torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    logits = model(idx[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def batch(seed: int) -> torch.Tensor:
    return torch.randint(0, 16, (2, 9), generator=torch.Generator().manual_seed(seed))


def eager_grads(model: nn.Module, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """torch.autograd.grad of the eager model, by parameter name."""
    names, params = zip(*model.named_parameters())
    return dict(zip(names, torch.autograd.grad(lm_loss(model, idx), params)))


def region_nodes(loss: torch.Tensor) -> list[str]:
    """The names of the CompiledFunctionBackward nodes of a loss's graph (torch's own walk)."""
    seen, stack, out = set(), [loss.grad_fn], []
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        if n.name() == "CompiledFunctionBackward":
            out.append(n.name())
        stack.extend(c for c, _ in n.next_functions)
    return out


@pytest.fixture(scope="module")
def compiled_gpt() -> tuple[nn.Module, nn.Module, CompileCounterWithBackend]:
    """(the eager GPT, `torch.compile` of it with aot_eager, the compile counter), compiled once for the module."""
    torch.manual_seed(0)
    model = GPT()
    counter = CompileCounterWithBackend("aot_eager")
    cm = torch.compile(model, backend=counter)
    lm_loss(cm, batch(0)).backward()  # the compile, untraced
    model.zero_grad(set_to_none=True)
    return model, cm, counter


def test_a_traced_step_of_a_compiled_gpt_is_the_eager_steps_trace(compiled_gpt: Any) -> None:
    model, cm, _ = compiled_gpt
    idx = batch(1)
    want = eager_grads(model, idx)
    with gradscape.Tracer(model, monitor=False) as ref_tr, ref_tr.step(0) as ref:  # the eager model's trace
        lm_loss(model, idx).backward()
    model.zero_grad(set_to_none=True)
    with gradscape.Tracer(cm, tensors="full") as tr, tr.step(0) as st:
        lm_loss(cm, idx).backward()
    assert st.meta["compiled"] == "eager" and "compiled" not in ref.meta
    assert len(st.nodes) == len(ref.nodes) > 100
    assert not [n for n in st.nodes if n.kind == "compiled"]
    assert [(n.name, n.module, n.source, n.param) for n in st.nodes] == \
        [(n.name, n.module, n.source, n.param) for n in ref.nodes]
    ops = [n for n in st.nodes if n.kind == "op" and n.name != "NllLossBackward0"]
    in_model = [n for n in ops if n.module is not None]
    assert len(in_model) >= len(ops) - 4  # the loss's own ops (cross-entropy, its reshapes) belong to no module
    assert {n.module for n in in_model} >= {"blocks.0.attn", "blocks.1.mlp.1", "ln", "head"}
    for name, g in want.items():  # the eager model's gradients, bit for bit
        assert np.array_equal(st.params[name].values, g.numpy()), name
        assert torch.equal(dict(model.named_parameters())[name].grad, g), name
    model.zero_grad(set_to_none=True)


def test_untraced_steps_stay_compiled_and_nothing_compiles_again(compiled_gpt: Any) -> None:
    """50 steps with every=10 (the monitor on, AdamW stepping) compile no more than 50 plain steps: none."""
    from torch._dynamo.utils import counters

    model, cm, counter = compiled_gpt
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def run(tr: Any) -> tuple[int, int]:
        frames, graphs = counters["frames"]["total"], counter.frame_count
        for i in range(50):
            with tr.step(i) if tr is not None else _nothing() as st:
                loss = lm_loss(cm, batch(i))
                assert bool(region_nodes(loss)) == (st is None), i  # compiled unless traced
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return counters["frames"]["total"] - frames, counter.frame_count - graphs

    plain = run(None)
    with gradscape.Tracer(cm, every=10) as tr:
        traced = run(tr)
    assert plain == traced == (0, 0)
    assert len(tr.steps) == 2 and all(s.meta["compiled"] == "eager" for s in tr.steps)
    assert len(tr.history) == 50


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_opaque_keeps_one_region_node_and_the_compiled_numerics(compiled_gpt: Any) -> None:
    model, cm, _ = compiled_gpt
    idx = batch(2)
    names, params = zip(*model.named_parameters())
    want = torch.autograd.grad(lm_loss(cm, idx), params)  # the compiled step's gradients, untraced
    with gradscape.Tracer(cm, compiled="opaque", monitor=False) as tr, tr.step(0) as st:
        lm_loss(cm, idx).backward()
    regions = [n for n in st.nodes if n.kind == "compiled"]
    assert len(regions) == 1 and regions[0].module == "<root>"
    assert st.meta["compiled"] == "opaque"
    ops = [n for n in st.nodes if n.kind == "op"]  # the region, then only the loss's few ops outside it
    assert len(ops) <= 4 and all(n.module is None for n in ops)
    for name, p, g in zip(names, params, want):
        assert torch.equal(p.grad, g), name
    model.zero_grad(set_to_none=True)


class _Gelu2(nn.Module):
    """A model whose block is `module.compile()`d and whose forward calls a `torch.compile(fn)` function."""

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.act = act
        self.block = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.block(x)))


def _scaled_gelu(h: torch.Tensor) -> torch.Tensor:
    return F.gelu(h) * 1.5 + h.pow(2)


def test_module_compile_and_a_compiled_function_inside_forward_are_traced_op_by_op() -> None:
    torch.manual_seed(0)
    eager = _Gelu2(_scaled_gelu)
    model = copy.deepcopy(eager)
    model.act = torch.compile(_scaled_gelu, backend="aot_eager")
    model.block.compile(backend="aot_eager")
    x = torch.randn(5, 4)
    model(x).sum().backward()  # compiled, untraced
    assert region_nodes(model(x).sum())
    model.zero_grad(set_to_none=True)
    want = torch.autograd.grad(eager(x).pow(2).mean(), list(eager.parameters()))
    with gradscape.Tracer(model, monitor=False) as tr, tr.step(0) as st:
        model(x).pow(2).mean().backward()
    assert st.meta["compiled"] == "eager" and not [n for n in st.nodes if n.kind == "compiled"]
    (gelu,) = [n for n in st.nodes if n.name == "GeluBackward0"]
    line = inspect.getsourcelines(_scaled_gelu)[1] + 1  # its op, in the compiled function's own line
    assert gelu.module == "<root>" and gelu.source is not None and gelu.source.endswith(f"test_compiled.py:{line}")
    (tanh,) = [n for n in st.nodes if n.name == "TanhBackward0"]
    assert tanh.module == "block.1"
    for p, w in zip(model.parameters(), want):
        assert torch.equal(p.grad, w)


def test_an_eager_model_has_no_compiled_meta() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    with gradscape.Tracer(model, monitor=False) as tr, tr.step(0) as st:
        model(torch.randn(4, 3)).sum().backward()
    assert "compiled" not in st.meta


def test_compiled_takes_eager_or_opaque() -> None:
    with pytest.raises(ValueError, match="compiled must be one of"):
        gradscape.Tracer(compiled="inductor")
