"""The roots of a backward call, read from its arguments: where autograd starts (`backward_roots`, for the recorder)
and the tensors it starts from (`root_values`: the losses the monitor and the problem finder read)."""

from __future__ import annotations

from typing import Any

import torch


def backward_roots(api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[tuple[Any, int]], Any, Any]:
    """The (node, input_nr) each root of a backward call starts from, and its `retain_graph` and
    `create_graph` (`retain_graph` defaults to `create_graph`, as torch has it)."""
    if api == "Tensor.backward" and len(args) == 1 and not kwargs:  # `loss.backward()` of an op's result
        t = args[0]
        fn = t.grad_fn if isinstance(t, torch.Tensor) else None
        if fn is not None:
            return [(fn, t.output_nr)], False, False
    if api == "Tensor.backward":
        tensors: Any = [args[0]]
        retain = kwargs.get("retain_graph", args[2] if len(args) > 2 else None)
        create = kwargs.get("create_graph", args[3] if len(args) > 3 else False)
    else:
        first = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
        tensors = [first] if isinstance(first, (torch.Tensor, torch.autograd.graph.GradientEdge)) \
            else list(first or ())
        if api == "autograd.grad":
            retain = kwargs.get("retain_graph", args[3] if len(args) > 3 else None)
            create = kwargs.get("create_graph", args[4] if len(args) > 4 else False)
        else:
            retain = kwargs.get("retain_graph", args[2] if len(args) > 2 else None)
            create = kwargs.get("create_graph", args[3] if len(args) > 3 else False)
    if retain is None:
        retain = create
    roots: list[tuple[Any, int]] = []
    for t in tensors:
        if isinstance(t, torch.autograd.graph.GradientEdge):
            roots.append((t.node, t.output_nr))
        elif isinstance(t, torch.Tensor) and t.requires_grad:
            if t.grad_fn is not None:  # an op's result: its edge (without `get_gradient_edge`'s ownership token)
                roots.append((t.grad_fn, t.output_nr))
            else:  # a leaf: its AccumulateGrad node
                e = torch.autograd.graph.get_gradient_edge(t)
                roots.append((e.node, e.output_nr))
    return roots, retain, create


def root_values(api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor | None]:
    """The tensors a backward starts from, one per root in `backward_roots`' order: a
    tensor that needs grad, or None for a `GradientEdge` (which has no value to read)."""
    if api == "Tensor.backward":  # (a method's `self`: one tensor)
        t = args[0]
        return [t] if isinstance(t, torch.Tensor) and t.requires_grad else []
    first = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
    tensors = [first] if isinstance(first, (torch.Tensor, torch.autograd.graph.GradientEdge)) else list(first or ())
    out: list[torch.Tensor | None] = []
    for t in tensors:
        if isinstance(t, torch.autograd.graph.GradientEdge):
            out.append(None)
        elif isinstance(t, torch.Tensor) and t.requires_grad:
            out.append(t)
    return out
