"""NOTE [Parameter rules in one call] (tracer/record/csrc/param_grads.h): the extension's per-parameter rules of
`st.params`, each checked against what torch left in the parameters' `.grad`s after real backward calls."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

from gradscape.tracer.record import native
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.summary.summariser import Summariser

ext = native.extension()
pytestmark = pytest.mark.skipif(ext is None, reason="the native recorder is not built")


def _call(g: native.NativeGraph, loss: torch.Tensor) -> list[tuple]:
    """One backward call of `loss`, recorded: `end_call`'s entries (each node's last run of the step so far)."""
    g.start_call([(loss.grad_fn, 0)], 0)
    loss.backward()
    return g.rec.end_call(0)[1]


def _setup() -> tuple[nn.Linear, native.NativeGraph, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    return model, native.NativeGraph(ModelIndex(model), Summariser(8), 8), torch.randn(4, 3)


def test_a_first_arrival_is_kept_as_the_arrival_and_an_accumulated_grad_is_pending() -> None:
    model, g, x = _setup()
    try:
        traces: dict = {}
        pending: dict = {}
        ext.after_call(_call(g, model(x).sum()), g.params, traces, pending, True)
        assert set(traces) == {"weight", "bias"} and pending == {}
        for name, p in model.named_parameters():
            run, ref, version = traces[name]
            assert ref() is p.grad and version == p.grad._version and run >= 0
        # a second call adds into the same `.grad` (in place): not what arrived, so kept to be summarised at the end
        ext.after_call(_call(g, model(x).square().sum()), g.params, traces, pending, True)
        assert traces == {"weight": None, "bias": None}
        assert {n: (t, v) for n, (t, v) in pending.items()} == {
            n: (p.grad, p.grad._version) for n, p in model.named_parameters()}
        assert all(pending[n][0] is p.grad for n, p in model.named_parameters())
        # a third: the very tensor that is pending, added to again: only its version moves
        before = {n: pending[n][1] for n in pending}
        ext.after_call(_call(g, model(x).sum()), g.params, traces, pending, True)
        for name, p in model.named_parameters():
            assert pending[name][0] is p.grad and pending[name][1] == p.grad._version > before[name]
        assert traces == {"weight": None, "bias": None}
    finally:
        g.rec.release()


def test_a_post_accumulate_hook_or_a_distributed_run_keeps_the_grad_pending() -> None:
    model, g, x = _setup()
    seen: list[str] = []
    model.weight.register_post_accumulate_grad_hook(lambda p: seen.append("w"))
    try:
        entries = _call(g, model(x).sum())
        traces: dict = {}
        pending: dict = {}
        ext.after_call(entries, g.params, traces, pending, True)
        assert seen == ["w"]
        assert traces["weight"] is None and pending["weight"][0] is model.weight.grad
        assert type(traces["bias"]) is tuple and "bias" not in pending
        traces, pending = {}, {}
        ext.after_call(entries, g.params, traces, pending, False)  # not plain: nothing taken as it arrived
        assert traces == {"weight": None, "bias": None} and set(pending) == {"weight", "bias"}
    finally:
        g.rec.release()


def test_the_last_entry_of_a_name_counts_and_unnamed_or_gradless_nodes_are_skipped() -> None:
    a, b = torch.ones(2), torch.zeros(2)
    var = nn.Parameter(torch.ones(2))
    entries = [(7, 1, a, True, 0, var), (9, 2, b, False, 3, var), (8, 3, a, True, 0, var), (5, 4, None, False, -1, var)]
    traces: dict = {}
    pending: dict = {}
    ext.after_call(entries, {7: "w", 9: "w", 5: "v"}, traces, pending, True)
    assert traces == {"w": None} and pending["w"] == (b, 3) and pending["w"][0] is b


def test_a_malformed_entry_is_named_and_nothing_is_lost() -> None:
    traces = {"w": "kept"}
    with pytest.raises(TypeError, match="after_call: each entry"):
        ext.after_call([(1, 2)], {1: "w"}, traces, {}, True)
    assert traces == {"w": "kept"}


def test_unchanged_runs_holds_only_for_the_same_tensor_at_the_same_version() -> None:
    model, g, x = _setup()
    try:
        traces: dict = {}
        ext.after_call(_call(g, model(x).sum()), g.params, traces, {}, True)
        names = ["weight", "bias"]
        grads = [model.weight.grad, model.bias.grad]
        runs = ext.unchanged_runs(list(map(traces.get, names)), grads)
        assert runs == [traces["weight"][0], traces["bias"][0]]
        assert ext.unchanged_runs(list(map(traces.get, names)), grads[:1]) is None  # (lengths differ)
        assert ext.unchanged_runs([None, traces["bias"]], grads) is None
        model.bias.grad.mul_(2)  # its version moves
        assert ext.unchanged_runs(list(map(traces.get, names)), grads) is None
        assert ext.unchanged_runs([traces["weight"]], [model.weight.grad.clone()]) is None  # another tensor
    finally:
        g.rec.release()


def test_made_hands_over_a_summary_only_of_the_same_unchanged_tensor() -> None:
    ga, gb, gc = torch.ones(3), torch.zeros(3), torch.ones(3)
    made_of: dict = {}
    ext.note_made(made_of, ("a", "b"), [ga, gb], [3, "S"])
    assert made_of["a"][0]() is ga and made_of["a"][1:] == (ga._version, 3)
    assert ext.made(list(map(made_of.get, ["a", "b", "c"])), [ga, gb, gc]) == [3, "S", None]
    ga.add_(1)
    assert ext.made([made_of["a"], made_of["b"]], [ga, gc]) == [None, None]
    with torch.inference_mode():
        inf = torch.ones(2)
    ext.note_made(made_of, ["i"], [inf], [4])
    assert made_of["i"][1] == -1 and ext.made([made_of["i"]], [inf]) == [None]  # no version counter
    ref = made_of["b"][0]
    del gb, made_of["b"]
    assert ref() is None and ext.made([(ref, 0, "S")], [gc]) == [None]
    with pytest.raises(ValueError, match="note_made: names, grads and summaries differ"):
        ext.note_made(made_of, ["x"], [gc], [])


def test_stepped_reads_an_optimizers_gradients_in_its_order() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    opt = torch.optim.SGD([{"params": list(model[1].parameters())}, {"params": list(model[0].parameters())}], 0.1)
    model(torch.randn(2, 3)).sum().backward()
    model[0].bias.grad = None
    params = list(model.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    idx, grads = ext.stepped(opt.param_groups, index)
    want = [(index[id(p)], p.grad) for group in opt.param_groups for p in group["params"] if p.grad is not None]
    assert idx == [i for i, _ in want] == [2, 3, 0]
    assert all(a is b for a, (_, b) in zip(grads, want))
    del index[id(model[0].weight)]
    assert ext.stepped(opt.param_groups, index) is None  # a parameter the monitor has not indexed: Python's read

    class Tagged(nn.Parameter):
        pass

    other = torch.optim.SGD([Tagged(torch.ones(2))], 0.1)
    assert ext.stepped(other.param_groups, {}) is None  # a subclass's `.grad` may be its own


def test_note_made_holds_no_gradient() -> None:
    g = torch.ones(4)
    made_of: dict = {}
    ext.note_made(made_of, ["a"], [g], [0])
    ref = weakref.ref(g)
    del g
    assert ref() is None and made_of["a"][0]() is None


def test_resolve_params_gives_rows_and_the_replaced_ones_norms_as_torch_has_them() -> None:
    model, g, x = _setup()
    try:
        w = torch.ones(4, 2)
        w[0, 1] = float("nan")  # bias[1]'s and weight row 1's gradient are NaN
        traces: dict = {"other": "kept"}
        ext.after_call(_call(g, (model(x) * w).sum()), g.params, traces, {}, True)
        unmade: dict = {}
        resolved, rows = g.rec.resolve_params(traces, {"weight", "bias"}, unmade)
        assert resolved == {"other": "kept"} and rows == []
        for name, p in model.named_parameters():
            norm, bad = unmade[name]
            finite = p.grad[torch.isfinite(p.grad)]
            assert bad and norm == pytest.approx(finite.norm().item(), rel=1e-6)  # the finite elements' norm
        resolved, rows = g.rec.resolve_params(traces, ("bias",), {})
        assert rows == ["weight"] and type(resolved["weight"]) is int and "bias" not in resolved
        assert list(resolved) == ["other", "weight"]  # (in `traces`' order)
        assert g.rec.arrival_norms([traces["weight"][0]]) is None  # it counted a NaN
    finally:
        g.rec.release()


def test_arrival_norms_are_torchs_norms_of_what_arrived() -> None:
    model, g, x = _setup()
    try:
        traces: dict = {}
        ext.after_call(_call(g, model(x).square().sum()), g.params, traces, {}, True)
        norms = g.rec.arrival_norms([traces["weight"][0], traces["bias"][0]])
        assert norms == pytest.approx([model.weight.grad.norm().item(), model.bias.grad.norm().item()], rel=1e-6)
        assert g.rec.arrival_norms([10**6]) is None  # no such run: no summary
    finally:
        g.rec.release()


def test_group_norms_sum_each_layers_finite_norms_as_the_python_rule_does() -> None:
    from gradscape.tracer.record.debug.step_checks import _group_norms

    vals = [(3.0, False), (4.0, False), None, (float("nan"), False), (2.0, True), (float("inf"), False), (1.5, 0)]
    groups = [0, 0, 1, 1, 2, 2, 3]
    got = ext.group_norms(vals, groups, 5)
    assert got == _group_norms(vals, groups, 5) == [5.0, None, None, 1.5, None]
    torch.manual_seed(0)
    norms = [(v, False) for v in torch.rand(40, dtype=torch.float64).tolist()]
    layers = [k % 7 for k in range(40)]
    assert ext.group_norms(norms, layers, 7) == _group_norms(norms, layers, 7)  # the same sums, bit for bit
    with pytest.raises(ValueError, match="group_norms: values and groups differ"):
        ext.group_norms(vals, groups[:-1], 5)
    with pytest.raises(ValueError, match="in a group below n"):
        ext.group_norms([(1.0, False)], [5], 5)


def test_resolve_params_gives_a_settled_row_or_its_norm_as_an_arrivals() -> None:
    model, g, x = _setup()
    try:
        _call(g, model(x).sum())
        rows = g.rec.summarise([model.weight.grad, model.bias.grad * 0 + float("inf")])  # as `settle` does
        assert min(rows) >= 0
        traces = {"weight": rows[0], "bias": rows[1], "gone": -1}
        unmade: dict = {}
        resolved, kept = g.rec.resolve_params(traces, {"weight", "bias"}, unmade)
        assert resolved == {} and kept == []  # (a negative row: no summary, left out)
        assert unmade["weight"] == (pytest.approx(model.weight.grad.norm().item(), rel=1e-6), False)
        assert unmade["bias"] == (0.0, True)  # every element an Inf: no finite element, and it counted one
        resolved, kept = g.rec.resolve_params(traces, (), {})
        assert resolved == {"weight": rows[0], "bias": rows[1]} and kept == ["weight", "bias"]
    finally:
        g.rec.release()
