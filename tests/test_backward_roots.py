"""The (node, output nr) a backward call starts from (`backward_roots` in tracer/record/roots.py), against
torch's own `get_gradient_edge`, for each kind of root: an op's result, one output of several, a leaf, the
output of a custom `autograd.Function`, and a `GradientEdge` passed as it is."""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge

from gradscape.tracer.record.roots import backward_roots, root_values


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 2 * g


def _edge(t: torch.Tensor) -> tuple[Any, int]:
    e = get_gradient_edge(t)
    return e.node, e.output_nr


def test_each_kind_of_root_starts_where_torch_says() -> None:
    leaf = torch.randn(4, 3, requires_grad=True)
    result = (leaf * 3).sum()
    first, second = leaf.unbind(0)[1:3]  # outputs 1 and 2 of one node
    custom = _Twice.apply(leaf)
    roots = [result, second, leaf, custom, first]
    got, retain, create = backward_roots("autograd.backward", (roots,), {})
    assert (retain, create) == (False, False)
    assert len(got) == len(roots)
    for (node, nr), t in zip(got, roots):
        want_node, want_nr = _edge(t)
        assert node is want_node, t
        assert nr == want_nr, t
    assert got[1][1] == 2 and got[4][1] == 1  # (the multi-output node's own output numbers)
    assert type(got[2][0]).__name__ == "AccumulateGrad"


def test_a_gradient_edge_is_taken_as_it_is_and_a_tensor_without_grad_is_left_out() -> None:
    x = torch.randn(3, requires_grad=True)
    y = x.exp()
    edge = GradientEdge(y.grad_fn, 0)
    got, retain, create = backward_roots("autograd.backward", ([edge, torch.ones(2)],),
                                         {"retain_graph": True, "create_graph": True})
    assert got == [(y.grad_fn, 0)]
    assert (retain, create) == (True, True)
    s = y.sum()
    got, retain, create = backward_roots("Tensor.backward", (s, None, None, False), {})
    assert got == [_edge(s)]
    assert (retain, create) == (False, False)


def test_a_tensors_own_backward_starts_where_torch_says_with_its_flags() -> None:
    """`loss.backward(...)`: each kind of root, and `retain_graph` / `create_graph` given by place or by name;
    `root_values` (whose path for a tensor's own backward is its own) gives the tensor, or nothing without grad."""
    leaf = torch.randn(4, 3, requires_grad=True)
    first, second = leaf.unbind(0)[1:3]
    for t in ((leaf * 3).sum(), second, leaf, _Twice.apply(leaf), first):
        for args, kwargs, flags in (((t,), {}, (False, False)), ((t, None, True), {}, (True, False)),
                                    ((t, None, None, True), {}, (True, True)),
                                    ((t,), {"create_graph": True, "retain_graph": False}, (False, True))):
            got, retain, create = backward_roots("Tensor.backward", args, kwargs)
            assert got == [_edge(t)], t
            assert (retain, create) == flags
            assert root_values("Tensor.backward", args, kwargs) == [t]
    assert root_values("Tensor.backward", (torch.ones(2),), {}) == []
