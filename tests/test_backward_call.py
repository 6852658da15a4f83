"""NOTE [A backward call's ends in one call] (tracer/record/csrc/backward_call.h): what the extension's `start_call`
and `end_call` hand back, checked against torch's own graph and gradients, and the monitor's read of the `.grad`s
(`set_grads`) against the parameters themselves."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradscape.tracer import _compat
from gradscape.tracer.monitor.grad_norms import set_grads
from gradscape.tracer.record import native
from gradscape.tracer.record.carry import forward_key
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.record.tables import RUN_DTYPE
from gradscape.tracer.summary.summariser import Summariser

pytestmark = pytest.mark.skipif(native.extension() is None, reason="the native recorder is not built")


def _graph(model: nn.Module) -> native.NativeGraph:
    return native.NativeGraph(ModelIndex(model), Summariser(8), 8)


def _node_id(g: native.NativeGraph, t: torch.Tensor) -> int:
    nid = g.id_of(torch.autograd.graph.get_gradient_edge(t).node)
    assert nid is not None
    return nid


def test_a_calls_start_names_each_parameter_and_leaf_it_walks() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(5, 3, requires_grad=True)  # a leaf that is no parameter
    g = _graph(model)
    loss = model(x).square().sum()
    try:
        (root,) = g.start_call([(loss.grad_fn, 0)], 0)
        assert root == g.id_of(loss.grad_fn) == 0
        named = {_node_id(g, p): name for name, p in model.named_parameters()}
        assert g.params == named
        assert g.last_param == max(named)
        assert g.leaves == {_node_id(g, x): (5, 3)}
        assert g.acc_shapes == {**{_node_id(g, p): tuple(p.shape) for p in model.parameters()}, _node_id(g, x): (5, 3)}
        assert g.size == len(g.name)  # the arrays read afterwards are the walk's
        # a second call adds only what it walks: the same parameters, no new entries
        loss2 = model(x).sum()
        before = dict(g.params)
        g.start_call([(loss2.grad_fn, 0)], 0)
        assert g.params == before and g.size > len(named) + 1
    finally:
        g.release()


def test_a_calls_start_takes_only_graph_nodes_and_says_which_root_is_not() -> None:
    model = nn.Linear(2, 2)
    g = _graph(model)
    loss = model(torch.randn(1, 2)).sum()
    try:
        with pytest.raises(TypeError, match=r"root 1 is a Tensor, not a graph node"):
            g.start_call([(loss.grad_fn, 0), (loss, 0)], 0)
        assert g.size == 0 and g.params == {}  # nothing walked
    finally:
        g.release()


def test_a_calls_end_reads_each_parameters_grad_and_whether_it_is_what_arrived() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    g = _graph(model)
    loss = model(torch.randn(6, 3)).sum()
    try:
        g.start_call([(loss.grad_fn, 0)], 0)
        g.rec.begin_pass(0)
        loss.backward()
        runs, entries = g.rec.end_call(0)
        assert runs == len(g.rec.records()[0]) // RUN_DTYPE.itemsize  # every run the hooks recorded
        by_name = {g.params[nid]: (run, grad, same, version) for nid, run, grad, same, version, _var in entries}
        assert sorted(by_name) == sorted(n for n, _ in model.named_parameters())
        assert [v[0] for v in by_name.values()] == sorted(v[0] for v in by_name.values())  # in the order they ran
        for name, p in model.named_parameters():
            _run, grad, same, version = by_name[name]
            assert grad is p.grad and same and version == p.grad._version
        # changed in place: still what arrived (the same memory), at a later version; a new tensor is not
        w, b = model[0].weight, model[0].bias
        w.grad.mul_(2)
        b.grad = b.grad.clone()
        after = g.rec.end_call(0)[1]
        entries = {g.params[nid]: (grad, same, version) for nid, _run, grad, same, version, _var in after}
        assert entries["0.weight"][1] and entries["0.weight"][2] == w.grad._version > by_name["0.weight"][3]
        assert entries["0.bias"][0] is b.grad and not entries["0.bias"][1]
    finally:
        g.release()


def test_the_monitors_read_of_grads_matches_the_parameters() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model(torch.randn(2, 3))[:, 0].sum().backward()
    params = list(model.parameters())
    params[1].grad = None
    idx, grads = set_grads(params)
    assert idx == [0, 2, 3]
    assert all(gr is params[i].grad for i, gr in zip(idx, grads))

    class Marked(torch.Tensor):  # a subclass's `.grad` may be its own: read by Python, the same answer
        pass

    odd = torch.zeros(2, requires_grad=True).as_subclass(Marked)
    odd.grad = torch.ones(2)
    assert native.extension().grads([*params, odd]) is None
    idx, grads = set_grads([*params, odd])
    assert idx == [0, 2, 3, 4] and grads[-1] is odd.grad


def test_a_calls_key_tells_apart_the_same_graph_over_other_parameters_or_leaves() -> None:
    """The key a carried step is checked by (NOTE [Carried forwards]) holds the names of the parameters a call
    walked and the shapes of its other leaves, not only the graph's structure."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"a": nn.Linear(3, 3), "b": nn.Linear(3, 3)})

    def key(layer: str, x: torch.Tensor) -> bytes:
        g = _graph(model)
        seq0 = _compat.sequence_nr()
        loss = model[layer](x).sum()
        try:
            g.start_call([(loss.grad_fn, 0)], seq0)
            return forward_key(g, b"")
        finally:
            g.release()

    x4, x5 = torch.randn(4, 3, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    assert key("a", x4) == key("a", x4.detach().requires_grad_())  # the same forward again: the same key
    assert key("a", x4) != key("b", x4)  # the same graph over the other layer's parameters
    assert key("a", x4) != key("a", x5)  # another shape of the input leaf (no node of the graph's own differs)


def test_root_rows_are_the_summaries_of_the_gradients_each_calls_roots_got() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    g = _graph(model)
    try:
        seeds = [torch.randn(4, 2), torch.randn(4, 2)]
        specs = []
        for k, seed in enumerate(seeds):  # two calls, each from its own output with its own seed gradient
            out = model(torch.randn(4, 3))
            (rid,) = g.start_call([(out.grad_fn, 0)], 0)
            start = int(g.rec.begin_pass(k))
            out.backward(seed)
            g.rec.end_call(start)
            specs.append((rid, 0, k, start))
        rows = g.rec.root_rows(specs)
        norms = g.rec.row_norms(rows)
        assert norms == pytest.approx([s.norm().item() for s in seeds], rel=1e-6)
        rid, _, _, start = specs[1]
        assert g.rec.root_rows([(rid, 1, 1, start), (rid, 0, 0, start), (10**6, 0, 1, 0)]) == [None, None, None]
        with pytest.raises(TypeError):
            g.rec.root_rows([(rid, 0)])
    finally:
        g.rec.release()
