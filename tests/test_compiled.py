"""Compiled models on traced steps (NOTE [Compiled regions on a traced step] in tracer/record/compiled.py):
every op of a compiled region is traced, gradients are the eager model's bit for bit, and dynamo
compiles no more often than without gradscape. The references are torch's own (`torch.autograd.grad`
on the eager model, dynamo's compile counter), never the tracer."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

import gradscape
from bench.workloads import GPT
from gradscape.tracer import _compat

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo's own notes on what it compiles


def small_gpt() -> nn.Module:
    """bench/workloads.py's GPT (W3's) at toy size: vocab 16, 8 positions, 2 layers, d=16, 2 heads."""
    return GPT(vocab=16, seq_len=8, n_layers=2, d_model=16, n_heads=2)


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
    model = small_gpt()
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
    assert {n.module for n in in_model} >= {"blocks.0.attn", "blocks.1.mlp.1", "ln_f", "head"}
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
            with tr.step(i) if tr is not None else nullcontext() as st:
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


@pytest.mark.parametrize("stance", ["swapped", "torch's context"])
def test_module_compile_and_a_compiled_function_inside_forward_are_traced_op_by_op(
        stance: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also with the stance set through `torch.compiler.set_stance`, as on a torch without the names
    `_compat.force_eager` swaps (none of the supported releases: a fault made by hand); the stance is put back."""
    if stance != "swapped":
        monkeypatch.setattr(_compat, "_STANCE", [None])
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
    assert torch._dynamo.eval_frame._stance.stance == "default"


def test_a_process_that_compiled_nothing_keeps_dynamos_stance_on_a_traced_step() -> None:
    """Nothing of gradscape's on torch's calls until a compiled callable is made: an optimizer loads dynamo
    (torch 2.13), and under "force_eager" its calls take another path (NOTE [Compiled regions on a traced
    step]). Once one is made (here after `torch._dynamo.reset()` forgot those of earlier tests), the traced
    block runs under "force_eager" and puts the stance back."""
    from torch._dynamo import eval_frame

    torch._dynamo.reset()
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    own = eval_frame._callback_from_stance
    seen = []
    with gradscape.Tracer(model, monitor=False) as tr:
        for i in range(2):
            if i == 1:
                double = torch.compile(lambda t: t * 2, backend="eager")
            with tr.step(i) as st:
                seen.append((eval_frame._stance.stance, eval_frame._callback_from_stance is own))
                loss = model(torch.randn(4, 3)).sum()
                (double(loss) if i == 1 else loss).backward()
                opt.step()
            assert seen[-1][0] == "default" or st.meta.get("compiled") == "eager"
    assert seen == [("default", True), ("force_eager", False)]
    assert eval_frame._stance.stance == "default" and eval_frame._callback_from_stance is own


def test_an_eager_model_has_no_compiled_meta() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    with gradscape.Tracer(model, monitor=False) as tr, tr.step(0) as st:
        model(torch.randn(4, 3)).sum().backward()
    assert "compiled" not in st.meta


def test_compiled_takes_eager_or_opaque() -> None:
    with pytest.raises(ValueError, match="compiled must be one of"):
        gradscape.Tracer(compiled="inductor")


@pytest.mark.slow
def test_inductor_gpt_traced_step_is_eager_and_compare_compiled_sees_its_rounding() -> None:
    """The issue's own setting: a GPT under inductor (C++ on the CPU), with AdamW, traced every 5th step."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = small_gpt()
    cm = torch.compile(model)  # inductor
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with gradscape.Tracer(cm, every=5, tensors="full") as tr:
        frames = counters["frames"]["total"]
        for i in range(11):
            idx = batch(i)
            want = eager_grads(model, idx) if i % 5 == 0 else None
            with tr.step(i) as st:
                lm_loss(cm, idx).backward()
            if want is not None:
                assert st is not None and st.meta["compiled"] == "eager"
                for name, g in want.items():
                    assert np.array_equal(st.params[name].values, g.numpy()), (i, name)
            opt.step()
            opt.zero_grad(set_to_none=True)
        assert counters["frames"]["total"] - frames == 1  # the one compile, at step 1 (step 0 ran eagerly)
        idx = batch(11)
        names, params = zip(*model.named_parameters())
        c_ref = torch.autograd.grad(lm_loss(cm, idx), params)
        e_ref = torch.autograd.grad(lm_loss(model, idx), params)
        st = tr.compare_compiled(11, lambda: lm_loss(cm, idx).backward())
    rec = st.meta["compare_compiled"]["params"]
    for name, c, e in zip(names, c_ref, e_ref):
        assert rec[name]["max_abs"] == float((c.double() - e.double()).abs().max()), name
        assert torch.equal(dict(model.named_parameters())[name].grad, c), name  # training's: the compiled ones
    assert any(r["max_abs"] > 0 for r in rec.values())  # inductor's fused kernels round otherwise


class TiedGPT(GPT):
    """bench/workloads.py's toy GPT with its head tied to the token embedding, bias-free, as nanoGPT's model
    (and GPT-2's) has it: the one tied weight gets the sum of both uses' gradients."""

    def __init__(self) -> None:
        super().__init__(vocab=16, seq_len=8, n_layers=2, d_model=16, n_heads=2)
        self.head = nn.Linear(16, 16, bias=False)
        self.head.weight = self.tok_emb.weight


ACCUM = 3  # micro-steps per optimizer step (nanoGPT's gradient_accumulation_steps)


def micro_loss(model: Callable[[torch.Tensor], torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.float16):
        return lm_loss(model, idx) / ACCUM


def stepped_with(passes: list[tuple[torch.Tensor, ...]], scale: float, max_norm: float) -> list[torch.Tensor]:
    """What the optimizer steps with, from each micro-step's `torch.autograd.grad`: summed in their order (as
    `.grad` accumulates them), unscaled (times 1/scale: a power of two, exact) and clipped by torch's own
    `clip_grad_norm_`."""
    leaves = []
    for k, grads in enumerate(zip(*passes)):
        total = grads[0].clone()
        for g in grads[1:]:
            total += g
        leaves.append(torch.zeros_like(total, requires_grad=True))
        leaves[k].grad = total * (1.0 / scale)
    torch.nn.utils.clip_grad_norm_(leaves, max_norm)
    return [p.grad for p in leaves]  # type: ignore[misc]


@pytest.mark.slow
def test_a_nanogpt_style_compiled_loop_traces_op_by_op_with_the_eager_gradients() -> None:
    """nanoGPT's training loop in its shape, on the CPU under inductor: a tied GPT, `torch.compile`, AdamW with
    decayed and undecayed groups, GradScaler over float16 autocast, 3 micro-steps per step, clipping, every 2nd
    step traced. A traced step has every op as a node, and each micro-step's gradient at each parameter is
    `torch.autograd.grad` of the eager model's, bit for bit; so is what the optimizer stepped with."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = TiedGPT()
    cm = torch.compile(model)  # inductor
    decay = [p for p in model.parameters() if p.dim() >= 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    names, params = zip(*model.named_parameters())
    assert "head.weight" not in names  # tied: one parameter
    frames = counters["frames"]["total"]
    with gradscape.Tracer(cm, every=2, tensors="full") as tr:
        for i in range(4):
            micro = [batch(ACCUM * i + k) for k in range(ACCUM)]
            scale = float(scaler.get_scale())
            want = [torch.autograd.grad(scaler.scale(micro_loss(model, idx)), params) for idx in micro] \
                if i % 2 == 0 else None
            with tr.step(i) as st:
                for idx in micro:
                    scaler.scale(micro_loss(cm, idx)).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
            if want is None:
                assert st is None
                continue
            assert st is not None and st.meta["compiled"] == "eager" and len(st.passes) == ACCUM
            assert not [n for n in st.nodes if n.kind == "compiled"]
            assert {"NativeLayerNormBackward0", "EmbeddingBackward0", "GeluBackward0"} <= {n.name for n in st.nodes}
            for k, name in enumerate(names):
                node = st.param_node(name)
                assert node is not None and len(node.runs) == ACCUM, name
                for run, g in zip(node.runs, (w[k] for w in want), strict=True):
                    assert np.array_equal(run.grad_outputs[0].values, g.numpy()), (i, name, run.pass_index)
            for name, g in zip(names, stepped_with(want, scale, 1.0), strict=True):
                assert np.array_equal(st.params[name].values, g.numpy()), (i, name)
    assert counters["frames"]["total"] - frames == 1  # compiled once, at step 1 (step 0 ran eagerly)
