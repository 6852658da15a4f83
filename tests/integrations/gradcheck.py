"""The tests' own record of what each optimizer stepped with, and what a traced step says arrived at
each parameter. Neither reads the tracer's idea of "the gradient the optimizer used"."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

import gradscape


class UsedGradients:
    """Each `optimizer.step()` of the given optimizers, in call order: {parameter name: its `.grad`}.

    Read in a step post-hook: Lightning runs its closure (forward, backward, unscaling, clipping) inside
    `optimizer.step(closure)`, after the pre-hooks, and torch's optimizers never write `.grad`, so after
    the step `.grad` is what the step used."""

    def __init__(self, named: Iterable[tuple[str, torch.nn.Parameter]], *optimizers: torch.optim.Optimizer) -> None:
        self.names = {p: n for n, p in named}
        self.steps: list[tuple[int, dict[str, np.ndarray]]] = []  # (which optimizer, gradients)
        self._handles = [opt.register_step_post_hook(self._record) for opt in optimizers]
        self._which = {id(opt): k for k, opt in enumerate(optimizers)}

    def _record(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads = {self.names[p]: p.grad.detach().clone().numpy() for group in opt.param_groups for p in group["params"]
                 if p.grad is not None}
        self.steps.append((self._which[id(opt)], grads))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def arrivals(st: gradscape.StepTrace, name: str) -> list[np.ndarray]:
    """What arrived at the parameter's AccumulateGrad node in each backward pass of the step, in pass
    order (needs `tensors="full"`)."""
    runs = sorted((r.pass_index, r.order, r.grad_outputs[0]) for n in st.nodes if n.param == name for r in n.runs)
    out = []
    for _, _, t in runs:
        assert t is not None and t.values is not None, f"{name}: no values kept (tensors='full'?)"
        out.append(t.values)
    return out


def accumulated(st: gradscape.StepTrace, name: str) -> np.ndarray:
    """The passes' arrivals added up in pass order, as AccumulateGrad adds them into `.grad` (float32
    addition in the same order: bitwise what `.grad` held after the last pass)."""
    parts = arrivals(st, name)
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def clipped(grads: dict[str, np.ndarray], order: list[str], max_norm: float) -> dict[str, np.ndarray]:
    """`torch.nn.utils.clip_grad_norm_` applied to copies of `grads`, over the parameters in `order` (the
    order the trainer clipped them in: the total norm is summed in that order)."""
    params = []
    for name in order:
        p = torch.nn.Parameter(torch.zeros(grads[name].shape))
        p.grad = torch.from_numpy(grads[name].copy())
        params.append(p)
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    return {name: p.grad.numpy() for name, p in zip(order, params)}  # type: ignore[union-attr]


def total_norm(grads: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())))
