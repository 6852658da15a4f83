"""Independent references for tests: torch's own engine, never the tracer."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from torch.autograd.graph import GradientEdge

# The devices a device-parametrised test runs on: "cuda" is skipped where torch sees no GPU (CI has none;
# bench/cuda.sh runs every CUDA test on a GPU machine, `pytest -k cuda`)
CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))
DEVICES = ["cpu", CUDA]


def graph_nodes(*roots: Any) -> list[Any]:
    """Preorder DFS over next_functions from the roots' grad_fn (slot 0 first), the order in which the
    tracer promises to number nodes. Used only to pair tracer ids with torch nodes."""
    order: list[Any] = []
    seen: set[Any] = set()
    for r in roots:
        stack = [r.grad_fn if isinstance(r, torch.Tensor) else r]
        while stack:
            n = stack.pop()
            if n is None or n in seen:
                continue
            seen.add(n)
            order.append(n)
            stack.extend(c for c, _ in reversed(n.next_functions) if c is not None and c not in seen)
    return order


def grad_wrt_outputs(loss: torch.Tensor, node: Any) -> list[torch.Tensor | None]:
    """∂loss/∂(each forward output of node), from the engine."""
    outs = []
    for i in range(len(node._input_metadata)):
        (g,) = torch.autograd.grad(loss, [GradientEdge(node, i)], retain_graph=True, allow_unused=True)
        outs.append(g)
    return outs


def vjp_of_node(node: Any, grad_outputs: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """What node sends along each of its slots, given what arrived: the node's own backward formula
    called directly (a vector-Jacobian product), outside any hook. Needs the graph retained."""
    args = [g if g is not None else torch.zeros(tuple(m.shape), dtype=m.dtype, device=m.device)
            for g, m in zip(grad_outputs, node._input_metadata)]
    with torch.no_grad():
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            # a custom Function's backward returns one value per forward argument; slots exist only
            # for the tensor ones (the None entries of the zoo's Functions are the non-tensor args)
            res = tuple(r for r in node.apply(*args) if r is not None)
        else:
            res = node(*args)
    if isinstance(res, torch.Tensor) or res is None:
        res = (res,)
    out: list[torch.Tensor | None] = []
    for g, (child, nr) in zip(res, node.next_functions):
        if g is not None and child is not None:  # the engine reduces broadcast grads to the input's shape
            g = g.sum_to_size(tuple(child._input_metadata[nr].shape))
        out.append(g)
    return out


def close(a: np.ndarray, b: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-6) -> bool:
    ref = b.detach().float().cpu().numpy()
    return a.shape == ref.shape and np.allclose(a, ref, rtol=rtol, atol=atol, equal_nan=True)


def scaler_step(model: Any, opt: Any, scaler: Any, loss: torch.Tensor, skip: bool = False) -> None:
    """One GradScaler step of `loss`; `skip`: a finite loss whose weight gradient is NaN (sqrt's at 0 times 0),
    a step GradScaler skips."""
    if skip:
        loss = loss + torch.sqrt(model.weight.sum() * 0.0)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()


def amp_step(model: Any, opt: Any, scaler: Any, x: torch.Tensor, y: torch.Tensor, device: str = "cpu") -> None:
    """One step of the AMP recipe: the forward under float16 autocast, a squared error, GradScaler's scaled backward,
    its unscale (so that the monitor sees it), its step and update."""
    with torch.autocast(device, dtype=torch.float16):
        loss = (model(x).float() - y).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()


def is_light(ctx: Any) -> bool:
    """`Tracer.step` handed out a light step's context (NOTE [Light steps]): the Python one or the native block."""
    return getattr(ctx, "light", False) is True


def kept_rows(mon: Any) -> int:
    """Light rows kept by the monitor `mon` that have not joined its history (Python's and the native block's)."""
    native = mon.light.native
    return len(mon.light.rows) + (native.size() if native is not None else 0)


def untimed(wire: Any) -> Any:
    """The wire step less what differs between two runs of the same step (times, the run's name)."""
    w = copy.deepcopy(wire)
    w["run"] = None
    for n in w["nodes"]:
        n["t"] = None
        for r in n["runs"]:
            r[4] = None
    for p in w["passes"]:
        p["start"] = p["end"] = None
    w["meta"] = {k: v for k, v in w["meta"].items() if "time" not in k and not k.endswith("_ms")}
    return w
