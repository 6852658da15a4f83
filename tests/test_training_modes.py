"""Every way people really train: sparse gradients, torch.func transforms, gradient accumulation,
torch.autograd.grad, wrapper modules, and bad input. Gradients are checked against the engine's own
(`.grad`, `torch.autograd.grad`) or against values computed here with numpy, never against the tracer."""

from __future__ import annotations

import copy
import math
import sys
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradscape
from gradscape.tracer.summary.summariser import Summariser


def _vals(t: gradscape.TensorTrace | None) -> np.ndarray:
    assert t is not None and t.values is not None
    return t.values


def _stats(a: np.ndarray) -> dict[str, float]:
    """The statistics a TensorTrace promises, computed here from the dense array."""
    v = a.astype(np.float64).ravel()
    return {"min": v.min(), "max": v.max(), "mean": v.mean(), "std": v.std(ddof=1), "norm": math.sqrt((v * v).sum()),
            "zeros": float((v == 0).sum()), "nan": 0.0, "inf": 0.0}


def _block_means(a: np.ndarray, size: int) -> np.ndarray:
    """Block means of a 2-D array to at most size×size cells, the last block of a dimension shorter."""
    kr, kc = -(-a.shape[0] // size), -(-a.shape[1] // size)
    rows = [a[i:i + kr] for i in range(0, a.shape[0], kr)]
    return np.array([[r[:, j:j + kc].mean() for j in range(0, a.shape[1], kc)] for r in rows])


def _assert_stats(got: dict[str, float], dense: np.ndarray) -> None:
    want = _stats(dense)
    for k, v in want.items():
        assert math.isclose(got[k], v, rel_tol=1e-5, abs_tol=1e-6), (k, got[k], v)


# ---------------------------------------------------------------- 1. sparse gradients
class _SparseBag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4, sparse=True)
        self.fc = nn.Linear(4, 1)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(idx)).sum()


@pytest.mark.parametrize("mode", ["summary", "full"])
def test_sparse_embedding_gradient_is_summarised_and_kept(mode: str) -> None:
    torch.manual_seed(0)
    model = _SparseBag()
    twin = copy.deepcopy(model)
    idx = torch.tensor([[1, 2, 1], [7, 2, 2]])
    twin(idx).backward()
    tr = gradscape.Tracer(model, tensors=mode)
    with tr.step(0) as st:
        model(idx).backward()
    assert st is not None and st.error is None
    g = model.emb.weight.grad
    assert g is not None and g.is_sparse and torch.equal(g.to_dense(), twin.emb.weight.grad.to_dense())
    dense = g.to_dense().numpy()
    p = st.params["emb.weight"]
    assert p.shape == (10, 4)
    _assert_stats(p.stats, dense)
    # 10×4 fits: the values themselves, to bfloat16's precision (NOTE [Arena thumbnails])
    assert p.thumb is not None and np.allclose(p.thumb, dense, rtol=2**-8, atol=1e-7)
    if mode == "full":
        assert np.array_equal(_vals(p), dense)
    acc = st.param_node("emb.weight")
    assert acc is not None and acc.grad_outputs is not None and acc.grad_outputs[0] is not None
    _assert_stats(acc.grad_outputs[0].stats, dense)  # what arrived: the uncoalesced gradient, summed
    emb_node = next(n for n in st.nodes if n.name == "EmbeddingBackward0")
    assert emb_node.grad_inputs is not None and emb_node.grad_inputs[0] is not None


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
def test_sparse_summaries_never_densify_and_match_numpy() -> None:
    torch.manual_seed(0)
    s = Summariser(thumb=8)
    # COO with a dense dimension, duplicates included, 200×30: block means of 25×4 cells
    idx = torch.tensor([[3, 150, 3, 199, 0]])
    vals = torch.randn(5, 30)
    coo = torch.sparse_coo_tensor(idx, vals, (200, 30), check_invariants=True)
    a = s.summarise(coo)
    # CSR, 3-D COO and an enormous COO (4e12 elements: a dense copy could not even be allocated)
    m = torch.zeros(20, 50)
    m[3, 7], m[19, 49], m[0, 0] = 2.0, -1.5, 0.25
    csr = m.to_sparse_csr()
    b = s.summarise(csr)
    coo3 = torch.randn(3, 4, 5).relu().to_sparse()
    c = s.summarise(coo3)
    huge = torch.sparse_coo_tensor(torch.tensor([[5, 1_999_999], [3, 1_999_999]]), torch.tensor([1.0, -2.0]),
                                   (2_000_000, 2_000_000), check_invariants=True)
    d = s.summarise(huge)
    s.finalize()
    dense = coo.to_dense().numpy()
    _assert_stats(a.stats, dense)
    assert a.thumb is not None and np.allclose(a.thumb, _block_means(dense, 8), rtol=2**-8, atol=1e-6)
    _assert_stats(b.stats, m.numpy())
    assert b.thumb is not None and np.allclose(b.thumb, _block_means(m.numpy(), 8), rtol=2**-8, atol=1e-7)
    d3 = coo3.to_dense().numpy()
    _assert_stats(c.stats, d3)
    assert c.thumb is not None and np.allclose(c.thumb, _block_means(d3.reshape(12, 5), 8), rtol=2**-8, atol=1e-7)
    assert d.shape == (2_000_000, 2_000_000) and d.thumb is not None and d.thumb.shape == (8, 8)
    assert (d.stats["min"], d.stats["max"], d.stats["zeros"]) == (-2.0, 1.0, 4e12 - 2)
    assert math.isclose(d.stats["norm"], math.sqrt(5.0)) and math.isclose(d.stats["mean"], -1.0 / 4e12)
    assert d.thumb[0, 0] == pytest.approx(1.0 / 250_000**2, rel=2**-8)
    assert d.thumb[7, 7] == pytest.approx(-2.0 / 250_000**2, rel=2**-8)


# ---------------------------------------------------------------- 2. torch.func
def test_torch_func_transforms_run_untouched_with_one_warning() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(5, 3)

    def loss(p: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, p, (xb,)).pow(2).sum()

    want_g = torch.func.grad(loss)(params, x)
    want_per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x[:, None])
    want_jac = torch.func.jacrev(lambda xb: model(xb).sum(1))(x)
    tr = gradscape.Tracer(model)
    with pytest.warns(RuntimeWarning, match="torch.func") as caught, tr.step(0) as st:
        g = torch.func.grad(loss)(params, x)
        per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x[:, None])
        jac = torch.func.jacrev(lambda xb: model(xb).sum(1))(x)
        model(x).pow(2).sum().backward()  # an ordinary backward in the same step is traced
    assert len(caught) == 1
    for k in want_g:
        assert torch.equal(g[k], want_g[k]) and torch.equal(per_sample[k], want_per_sample[k]), k
    assert torch.equal(jac, want_jac)
    assert st is not None and st.error is None and any("torch.func" in n for n in st.meta["notes"])
    assert len(st.passes) == 1 and st.params.keys() == {"0.weight", "0.bias", "2.weight", "2.bias"}
    with tr.step(1) as st2:  # warned once per Tracer; still noted in every step
        torch.func.grad(loss)(params, x)
    assert st2 is not None and any("torch.func" in n for n in st2.meta["notes"])


def test_steps_never_read_functorchs_interpreter_stack() -> None:
    """Reading functorch's interpreter stack makes its thread state, which the engine then copies on every backward
    call of the thread (NOTE [Transforms] in tracer/record/recorder.py): traced, full and light steps ask the
    thread's dispatch keys instead. (A profile function sees the call however the function was bound.)"""
    peek = torch._C._functorch.peek_interpreter_stack
    seen: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and arg is peek:
            seen.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")

    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tr = gradscape.Tracer(model, every=3)
    traced = []
    sys.setprofile(profile)
    try:
        for i in range(12):  # traced (0, 3, ...), full and light monitor steps
            with tr.step(i) as st:
                model(torch.randn(4, 3)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
            traced += [st.step] if st is not None else []
    finally:
        sys.setprofile(None)
        tr.close()
    assert traced == [0, 3, 6, 9] and seen == []


# ---------------------------------------------------------------- 3, 4. what st.params holds
def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))


def test_accumulation_over_micro_batches_reports_the_accumulated_grad() -> None:
    model = _mlp()
    batches = [torch.randn(4, 3) for _ in range(3)]
    per_batch = [torch.autograd.grad(model(xb).pow(2).mean(), list(model.parameters())) for xb in batches]
    tr = gradscape.Tracer(model, tensors="full")
    with tr.step(0) as st:
        for xb in batches:
            (model(xb).pow(2).mean() / len(batches)).backward()
        summed = {n: p.grad.clone() for n, p in model.named_parameters()}  # type: ignore[union-attr]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)  # no optimizer: the clipped sum is what is used
        seen = {n: p.grad.clone() for n, p in model.named_parameters()}  # type: ignore[union-attr]
    assert st is not None and len(st.passes) == 3
    for k, (name, _) in enumerate(model.named_parameters()):
        assert np.array_equal(_vals(st.params[name]), seen[name].numpy()), name
        want = sum(pb[k] for pb in per_batch) / len(batches)  # accumulated: then clipped far below
        assert torch.allclose(summed[name], want, atol=1e-7) and seen[name].norm() < summed[name].norm() / 10
    # each pass's own contribution: the AccumulateGrad node's run in that pass
    for k, (name, _) in enumerate(model.named_parameters()):
        node = st.param_node(name)
        assert node is not None and [r.pass_index for r in node.runs] == [0, 1, 2]
        for run, grads in zip(node.runs, per_batch):
            assert np.allclose(_vals(run.grad_outputs[0]), grads[k].numpy() / len(batches), atol=1e-7), name


def test_accumulation_across_steps_without_zero_grad() -> None:
    model = _mlp()
    x = torch.randn(4, 3)
    model(x).sum().backward()  # an untraced step left .grad behind
    tr = gradscape.Tracer(model, tensors="summary")
    with tr.step(0) as st:
        model(x).sum().backward()
    assert st is not None
    for name, p in model.named_parameters():
        assert math.isclose(st.params[name].stats["norm"], float(p.grad.norm()), rel_tol=1e-6), name  # type: ignore


def test_autograd_grad_fills_params_with_what_it_returned() -> None:
    model = _mlp()
    x = torch.randn(4, 3)
    tr = gradscape.Tracer(model, tensors="full")
    with tr.step(0) as st:
        loss = model(x).pow(2).mean()
        grads = torch.autograd.grad(loss, list(model.parameters()))
    assert st is not None and len(st.passes) == 1 and st.passes[0].api == "autograd.grad"
    assert all(p.grad is None for p in model.parameters())
    for (name, _), g in zip(model.named_parameters(), grads):
        assert np.array_equal(_vals(st.params[name]), g.numpy()), name
    with tr.step(1) as st1:  # only some parameters, one tensor rather than a list
        g0 = torch.autograd.grad(model(x).sum(), model[2].weight)
    assert st1 is not None and list(st1.params) == ["2.weight"]
    assert np.array_equal(_vals(st1.params["2.weight"]), g0[0].numpy())


# ---------------------------------------------------------------- 6. wrappers
class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc(x))


class _Wrap(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def test_a_wrapper_does_not_take_its_modules_ops() -> None:
    model = _Wrap(_Wrap(_Inner()))
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        model(torch.randn(2, 3)).sum().backward()
    assert st is not None
    mods = {n.name: n.module for n in st.nodes if n.kind == "op"}
    assert mods["ReluBackward0"] == "module.module"
    assert mods["AddmmBackward0"] == "module.module.fc"
    assert mods["SumBackward0"] is None


# ---------------------------------------------------------------- bad input
def test_step_index_must_be_an_integer() -> None:
    tr = gradscape.Tracer(_mlp(), every=2)
    for bad in ("3", 1.5, None, True):
        with pytest.raises(TypeError, match="step index"):
            tr.step(bad)  # type: ignore[arg-type]
    with tr.step(np.int64(3)) as st:  # an integer of another type is fine
        assert st is None  # untraced: odd


def test_a_step_without_backward_warns_once_and_says_why() -> None:
    model = _mlp()
    tr = gradscape.Tracer(model)
    with pytest.warns(RuntimeWarning, match="no backward") as caught:
        for i in range(3):
            with tr.step(i) as st, torch.no_grad():
                model(torch.randn(2, 3))
            assert st is not None and "no backward" in st.meta["notes"][0]
    assert len(caught) == 1


@pytest.mark.parametrize("order", ["in order", "out of order"])
def test_two_tracers_whose_blocks_overlap(order: str) -> None:
    import torch._dynamo  # noqa: F401  (loaded: the traced blocks set the compiler's stance aside)

    a_model, b_model = _mlp(), _mlp()
    ta, tb = gradscape.Tracer(a_model, tensors="full"), gradscape.Tracer(b_model, tensors="full")
    x = torch.randn(4, 3)
    outer = ta.step(0)
    st_a = outer.__enter__()
    inner = tb.step(0)
    st_b = inner.__enter__()
    a_model(x).sum().backward()
    if order == "out of order":
        outer.__exit__(None, None, None)
        b_model(x).sum().backward()
        inner.__exit__(None, None, None)
    else:
        b_model(x).sum().backward()
        inner.__exit__(None, None, None)
        outer.__exit__(None, None, None)
    assert st_a is not None and st_b is not None
    assert np.array_equal(_vals(st_b.params["0.weight"]), b_model[0].weight.grad.numpy())  # type: ignore
    assert np.array_equal(_vals(st_a.params["0.weight"]), a_model[0].weight.grad.numpy())  # type: ignore
    assert torch._C._len_torch_function_stack() == 0
    with ta.step(1) as st:  # both still work afterwards
        a_model(x).sum().backward()
    assert st is not None and len(st.passes) == 1
    compiles: list[int] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        compiles.append(1)
        return gm.forward

    # torch.compile is itself again: the last block to close put the stance back, in any order
    # (NOTE [Compiled regions on a traced step] in tracer/record/compiled.py)
    torch.compile(lambda t: (t * 3).sin(), backend=counting)(x)
    assert compiles == [1]


def test_a_sink_path_that_cannot_be_opened_names_the_path(tmp_path: object) -> None:
    bad = f"{tmp_path}/no/such/folder/run.sqlite"
    with pytest.raises(gradscape.StoreError, match="no/such/folder/run.sqlite"):
        gradscape.Tracer(_mlp(), sink=bad)
