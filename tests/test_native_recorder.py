"""The native recorder (tracer/record/csrc/) records what the Python recorder records: the same step, traced
once by each, gives the same wire step bit for bit, times aside. And each recorder is checked against the
engine: gradients arriving at the parameters equal `p.grad`."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from earlier_release import step_to_wire
from helpers import CUDA, untimed
from torch import nn
from torch.utils.checkpoint import checkpoint
from zoo import ZOO, build

import gradscape
from gradscape.tracer.record import native


def test_make_test_built_the_native_recorder() -> None:
    used, why = native.status()
    assert used, f"the native recorder is not in use: {why}"


def _lstm() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    torch.manual_seed(0)
    cell = nn.LSTMCell(4, 8)
    xs = torch.randn(12, 3, 4)

    def loss(m: nn.Module) -> torch.Tensor:
        h = c = torch.zeros(3, 8)
        for x in xs:
            h, c = m(x, (h, c))
        return h.pow(2).mean()

    return cell, loss


class _Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.a, self.b, self.reentrant = nn.Linear(5, 5), nn.Linear(5, 2), reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(checkpoint(lambda t: torch.relu(self.a(t)), x, use_reentrant=self.reentrant))


class _Swish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)  # x used by two ops: its gradient through the module is their sum


class ModuleCalls(nn.Module):
    """Modules called twice, one of them summing its input's gradient over two ops."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act, self.out = nn.Linear(4, 4), _Swish(), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.fc(self.act(self.fc(x)))))


def _program(name: str, device: str = "cpu") -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    """A model and a loss of it, the same each time it is built (`device`: the zoo's programs only)."""
    if name in ZOO:
        case = build(name, device)
        return case.model, lambda m: case.loss(m, case.batch)
    if name == "lstm":
        return _lstm()
    torch.manual_seed(0)
    x = torch.randn(4, 5)
    if name.startswith("checkpoint"):
        xg = x.clone().requires_grad_()  # reentrant checkpoint passes gradients only to inputs that want one
        return _Checkpointed(name.endswith("reentrant")), lambda m: m(xg).sum()
    if name == "float64_strided":  # float64, and a strided input no kernel plan reads: the Python fallback
        lin = nn.Linear(5, 3).double()
        return lin, lambda m: m(x.double().t().contiguous().t()[:, ::2].repeat(1, 2)[:, :5]).pow(2).sum()
    if name == "sparse_embedding":  # a sparse gradient: summarised in Python from the C++ hook
        emb = nn.Embedding(10, 3, sparse=True)
        return emb, lambda m: m(torch.tensor([[1, 2, 2], [7, 1, 0]])).sum()
    if name == "module_calls":
        xg = torch.randn(3, 4, requires_grad=True)
        return ModuleCalls(), lambda m: m(xg).sum()
    if name == "half":
        lin = nn.Linear(5, 3).to(torch.float16)
        return lin, lambda m: F.mse_loss(m(x.half()).float(), torch.ones(4, 3))
    raise KeyError(name)


PROGRAMS = [*ZOO, "lstm", "checkpoint", "checkpoint_reentrant", "float64_strided", "sparse_embedding", "half",
            "module_calls"]


def _trace(name: str, python: bool, device: str = "cpu", **options: Any) -> tuple[Any, dict[str, Any]]:
    model, loss_of = _program(name, device)
    tr = gradscape.Tracer(model, recorder="python" if python else "native", **options)
    with tr.step(0) as st:
        loss_of(model).backward()
    assert st.meta.get("recorder") == ("python" if python else "native"), st.meta
    grads = {n: p.grad.to_dense() for n, p in model.named_parameters() if p.grad is not None}
    return step_to_wire(st), grads


@pytest.mark.parametrize("name", PROGRAMS)
def test_native_and_python_recorders_record_the_same_step(name: str) -> None:
    _same_step(name, "cpu")


@pytest.mark.parametrize("device", [CUDA])
@pytest.mark.parametrize("name", ZOO)
def test_native_and_python_recorders_record_the_same_cuda_step(name: str, device: str) -> None:
    """On CUDA the C++ hook hands every gradient to the Python summariser (the kernel reads host memory)."""
    _same_step(name, device)


def _same_step(name: str, device: str) -> None:
    py_wire, py_grads = _trace(name, True, device)
    nat_wire, nat_grads = _trace(name, False, device)
    assert py_grads.keys() == nat_grads.keys()
    for k in py_grads:  # the same program ran: the engine computed the same gradients
        assert torch.equal(py_grads[k], nat_grads[k]), k
    py, nat = untimed(py_wire), untimed(nat_wire)
    py["meta"].pop("recorder")
    nat["meta"].pop("recorder")
    for key in py:
        assert nat[key] == py[key], f"{name}: the recorders differ in {key!r}"


def test_the_thumbnail_budget_leaves_out_the_same_thumbnails() -> None:
    """Past the budget the smallest-norm thumbnails go: the native step's table and the Python step's
    objects are cut at the same place."""
    py_wire, _ = _trace("lstm", True, thumb_budget=2_000)
    nat_wire, _ = _trace("lstm", False, thumb_budget=2_000)
    left = py_wire["meta"]["thumbs_left_out"]
    assert left["count"] > 100, left  # the budget did cut
    assert nat_wire["meta"]["thumbs_left_out"] == left
    py, nat = untimed(py_wire), untimed(nat_wire)
    assert nat["tensors"] == py["tensors"]
    assert nat["nodes"] == py["nodes"]


@pytest.mark.parametrize("name, device", [("mlp", "cpu"), ("lstm", "cpu"), ("sparse_embedding", "cpu"),
                                          pytest.param("transformer", "cuda", marks=CUDA.marks),
                                          pytest.param("cnn", "cuda", marks=CUDA.marks)])
def test_native_recorder_param_summaries_are_the_engine_gradients(name: str, device: str) -> None:
    model, loss_of = _program(name, device)
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        loss_of(model).backward()
    assert st.meta.get("recorder") == "native"
    assert st.params, "no parameter gradients recorded"
    for pname, p in model.named_parameters():
        got = st.params[pname]
        ref = p.grad.to_dense().double()
        assert got.shape == tuple(ref.shape)
        assert got.stats["norm"] == pytest.approx(float(ref.norm()), rel=1e-6), pname
        assert got.stats["max"] == pytest.approx(float(ref.max()), rel=1e-6), pname


def test_steps_that_keep_values_are_recorded_in_python() -> None:
    """tensors="full" keeps every gradient's values, which the Python recorder does (native.py's NOTE)."""
    model, loss_of = _program("mlp")
    tr = gradscape.Tracer(model, tensors="full")
    with tr.step(0) as st:
        loss_of(model).backward()
    assert st.meta["recorder"] == "python (tensors='full': the native recorder keeps no gradient values)"
    w = st.params["fc1.weight"] if "fc1.weight" in st.params else next(iter(st.params.values()))
    assert w.values is not None


def test_without_a_build_steps_are_recorded_in_python_and_doctor_says_why(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADSCAPE_CACHE_DIR", str(tmp_path))  # a cache folder that holds no build
    native._loaded.cache_clear()
    try:
        used, why = native.status()
        assert not used and "gradscape build-recorder" in why and str(tmp_path) in why
        from gradscape.tracer.environment import environment

        assert environment().recorder.startswith("python (not built for torch")
        model, loss_of = _program("mlp")
        with gradscape.Tracer(model).step(0) as st:
            loss_of(model).backward()
        assert st.meta["recorder"] == f"python ({why})" and len(st.nodes) > 5
        with pytest.raises(RuntimeError, match=r"Tracer\(recorder='native'\): the native recorder cannot be used: "
                                               r"not built for torch"):
            gradscape.Tracer(model, recorder="native")
    finally:
        monkeypatch.undo()
        native._loaded.cache_clear()
    assert native.status()[0]


def test_a_failed_build_says_what_the_compiler_said(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradscape.tracer.record import native_build

    monkeypatch.setenv("GRADSCAPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", f"{sys.executable} -c \"import sys; sys.exit('no compiler in this test')\"")
    with pytest.raises(native_build.BuildError, match="no compiler in this test"):
        native_build.build()
    assert not native_build.target().exists()
    # no half-written file left behind: only the note that the build failed, which the fallback quotes
    assert [p.name for p in tmp_path.iterdir()] == [native_build.failed(native_build.target()).name]
    native._loaded.cache_clear()
    try:
        used, why = native.status()
        assert not used and why.startswith(f"the build failed (torch {torch.__version__}: no compiler in this test)")
        model, loss_of = _program("mlp")
        with gradscape.Tracer(model).step(0) as st:
            loss_of(model).backward()
        assert st.meta["recorder"] == f"python ({why})"
    finally:
        monkeypatch.undo()
        native._loaded.cache_clear()
    assert native.status()[0]


def test_strided_gradients_are_summarised_in_the_hook() -> None:
    """An expanded gradient (SumBackward0's, every stride 0) and a permuted one (PermuteBackward0's) are
    summarised by the kernel in the C++ hook, read where they lie (NOTE [Strided gradients] in
    tracer/record/csrc/summaries.h), and not through Python: the statistics are torch's, and the step has no
    Python-made summary (tests/test_strided_summaries.py compares them with the Python recorder's, bitwise)."""
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    x, other = torch.randn(2, 5, 6), torch.randn(3, 2, 5)
    tr = gradscape.Tracer(model, monitor=False)
    with tr.step(0) as st:
        (model(x).permute(2, 0, 1) * other).sum().backward()
    assert st.meta.get("recorder") == "native", st.meta
    assert st.nodes.tables.tensors.py == []  # type: ignore[attr-defined]
    by_name = {n.name: n for n in st.nodes}
    ones = by_name["SumBackward0"].grad_inputs[0]  # torch.ones(()).expand(3, 2, 5)
    assert ones.shape == (3, 2, 5) and (ones.stats["min"], ones.stats["max"], ones.stats["mean"]) == (1.0, 1.0, 1.0)
    assert ones.stats["norm"] == pytest.approx(30 ** 0.5, rel=1e-6)
    permuted = by_name["PermuteBackward0"].grad_inputs[0]
    want = other.permute(1, 2, 0)
    assert permuted.shape == (2, 5, 3)
    assert (permuted.stats["min"], permuted.stats["max"]) == (want.min().item(), want.max().item())
    assert permuted.stats["norm"] == pytest.approx(want.norm().item(), rel=1e-6)


def test_the_finder_reads_the_arrivals_the_optimizers_summaries_replace(monkeypatch: pytest.MonkeyPatch) -> None:
    """With an optimizer in the block, `st.params` holds what it stepped with and the arrivals are not made
    into `TensorTrace`s: the problem finder gets each arrival's norm and whether it counted a NaN or an Inf
    from the extension (`resolve_params`), checked here against torch on what arrived."""
    from gradscape.tracer.record.debug import problems

    seen: list[dict[str, tuple[float, bool]]] = []
    layer_norms = problems.layer_norms

    def spy(st: Any, module_params: Any, history: Any, unmade: Any = None, *rest: Any) -> Any:
        seen.append(dict(unmade or {}))
        return layer_norms(st, module_params, history, unmade, *rest)

    monkeypatch.setattr(problems, "layer_norms", spy)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    tr = gradscape.Tracer(model)
    weights = torch.ones(16, 3)
    weights[0, 1] = float("nan")  # one output's gradient is NaN: so are row 1 of 2.weight and 2.bias[1]
    arrived: list[dict[str, torch.Tensor]] = []
    start = copy.deepcopy(model.state_dict())
    for i, w in enumerate((weights, torch.ones(16, 3))):  # a step with a NaN, then a finite one
        with tr.step(i) as st:
            (model(torch.randn(16, 4)) * w).sum().backward()
            arrived.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
            opt.step()  # (a NaN gradient makes NaN weights even at lr 0: put them back)
            opt.zero_grad()
        model.load_state_dict(start)
        assert st is not None and st.meta["recorder"] == "native"
    assert len(seen) == 2
    for unmade, grads in zip(seen, arrived):
        assert set(unmade) == set(grads)
        for name, g in grads.items():
            norm, bad = unmade[name]
            assert bad == (not bool(torch.isfinite(g).all())), name
            finite = g[torch.isfinite(g)].double()  # the statistics are those of the finite values
            assert norm == pytest.approx(torch.linalg.vector_norm(finite).item(), rel=1e-6), name
    assert seen[0]["2.bias"][1] and not any(bad for _, bad in seen[1].values())


def test_a_native_steps_execution_order_is_made_when_read() -> None:
    """`st.execution` and `st.edges` of a natively recorded step are sequences over columns: the same tuples as
    the Python recorder's lists, made into a list only when read (NOTE [Lazy columns])."""
    model, loss_of = _program("lstm")
    with gradscape.Tracer(model, recorder="python").step(0) as py:
        loss_of(model).backward()
    model, loss_of = _program("lstm")
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        loss_of(model).backward()
    ex = st.execution
    assert st.meta["recorder"] == "native" and ex._list is None  # nothing made by the step itself
    assert len(ex) == len(py.execution) > 20 and ex._list is None
    assert ex == py.execution and py.execution == ex and list(ex) == py.execution
    assert ex[0] == py.execution[0] and ex[-3:] == py.execution[-3:]
    assert ex != py.execution[:-1] and ex != "not a sequence of runs"
    with pytest.raises(TypeError):
        hash(ex)
    edges = st.edges  # NOTE [Lazy columns]: the edges too
    cols = edges.columns()
    assert edges._list is None and len(edges) == len(py.edges) > 20 and edges._list is None
    assert sorted(edges) == sorted(py.edges) and edges == list(edges) and edges[1] == list(edges)[1]
    with tr.step(1) as again:  # the same graph: the columns are shared, each step's list its own
        loss_of(model).backward()
    assert cols is not None and all(a is b for a, b in zip(again.edges.columns(), cols))
    assert again.edges == edges and again.edges._list is not edges._list



def test_writing_a_native_step_to_a_trace_file_makes_neither_list(tmp_path: Any) -> None:
    """The trace file takes the execution order and the edges from the columns (NOTE [Lazy columns]): writing the
    step makes neither list, and the file reads back the same order and edges."""
    from gradscape.tracer.sinks.file import FileSink
    from gradscape.tracer.store import TraceStore

    model, loss_of = _program("lstm")
    tr = gradscape.Tracer(model, sink=FileSink(tmp_path / "t.sqlite"))
    with tr.step(0) as st:
        loss_of(model).backward()
    tr.close()
    assert st.execution._list is None and st.edges._list is None
    back = TraceStore(tmp_path / "t.sqlite").read_step(tr.run, 0)
    assert back.execution == list(st.execution) and sorted(back.edges) == sorted(st.edges)


def test_module_sums_are_rows_of_the_native_steps_table() -> None:
    """A module input that two ops used: its gradient through the call is their sum, summarised by the extension
    into the step's tensor table (no Python summary each), and read as the Python recorder's."""
    steps = {}
    for rec in ("native", "python"):
        model, loss_of = _program("module_calls")
        tr = gradscape.Tracer(model, recorder=rec)
        with tr.step(0) as st:
            loss_of(model).backward()
        steps[rec] = st
    nat, py = steps["native"].modules, steps["python"].modules
    assert nat.sums and all(isinstance(v, int) for v in nat.sums.values()) and nat.outside_table() == []
    assert len(py.outside_table()) == len(nat.sums)
    for a, b in zip(nat["act"].calls, py["act"].calls):
        (ga,), (gb,) = a.grad_input, b.grad_input
        assert ga.stats == gb.stats and (ga.thumb == gb.thumb).all()
