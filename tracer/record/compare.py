"""Compiled against eager: one step computed both ways from the same state, each parameter's gradient compared.

NOTE [Compare compiled]
    `Tracer.compare_compiled(i, closure)` answers "does torch.compile change my gradients?". `closure` is
    the step's forward and backward (as an optimizer's closure is: it calls `backward()` and may return
    the loss); it must not step an optimizer. gradscape calls it twice:
      1. compiled, as training runs it (an untraced step: the monitor's history row is this run's);
      2. eager and traced, from the state the first run started from: the random number generators'
         states (CPU, and CUDA where it is initialised) and the model's buffers are put back as they
         were, and every parameter's `.grad` is empty for the run. Its trace is the step's trace
         (`st`, what the sinks get), op by op, with the compiled regions run eagerly
         (NOTE [Compiled regions on a traced step] in compiled.py).
    Afterwards training is where the compiled run left it: the generators' states and the buffers are
    those after run 1, and each `.grad` is what run 1's backward made of it (a gradient there before the
    step has run 1's added in place, as autograd's accumulation does). The eager run changes nothing
    that training reads.

    `st.meta["compare_compiled"]`: `params`, for each parameter both runs gave a gradient, `max_abs`
    (max |c − e|), `max_rel` (max |c − e| / max(|e|, tiny), tiny the dtype's smallest normal number),
    `at` (the index of the largest |c − e|, a list) and `compiled` / `eager` (the two values there);
    a parameter only one run gave a gradient to has `missing` ("compiled" or "eager") instead.
    The differences are computed in float64; a NaN on either side counts as an infinite difference.
    `worst`: the parameter with the largest `max_abs`, and `max_abs`, its value; `loss`: the two losses
    (`compiled`, `eager`) when the closure returns a one-element tensor. A NaN or infinite number is
    written as text ("nan", "inf"), as JSON cannot hold it.

    Random ops compiled by inductor draw other numbers than eager ones from the same generator state
    (dropout masks differ), so compare a model without dropout, or set
    `torch._inductor.config.fallback_random = True`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


class TrainingState:
    """The random generators' states and copies of `buffers` (a model's), at one moment (`restore` puts them back)."""

    def __init__(self, buffers: Sequence[torch.Tensor] = ()) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        if buffers:  # (a model without buffers, called many times a step, pays no grad-mode switch)
            with torch.no_grad():
                self.buffers = [(b, b.clone()) for b in buffers]

    def restore(self) -> None:
        self.restore_rng()
        with torch.no_grad():
            for b, saved in self.buffers:
                b.copy_(saved)


    def restore_rng(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def _number(x: float) -> float | str:
    return x if math.isfinite(x) else repr(x)


def _value(t: torch.Tensor) -> float | str:
    return _number(float(t))


def param_difference(c: torch.Tensor, e: torch.Tensor) -> dict[str, Any]:
    """How far a compiled gradient `c` is from the eager one `e` (NOTE [Compare compiled])."""
    with torch.no_grad():
        c64, e64 = c.detach().to(torch.float64).cpu(), e.detach().to(torch.float64).cpu()
        if not c64.numel():
            return {"max_abs": 0.0, "max_rel": 0.0, "at": []}
        diff = (c64 - e64).abs().nan_to_num(nan=math.inf)  # a NaN on either side: an infinite difference
        tiny = torch.finfo(e.dtype).tiny if e.is_floating_point() else 1.0
        rel = diff / e64.abs().nan_to_num(nan=math.inf).clamp_min(tiny)
        rel = torch.where(diff == math.inf, math.inf, rel)
        flat = int(diff.reshape(-1).argmax())
        at = [int(k) for k in torch.unravel_index(torch.tensor(flat), diff.shape)]
        return {"max_abs": _value(diff.max()), "max_rel": _value(rel.max()), "at": at,
                "compiled": _value(c64.reshape(-1)[flat]), "eager": _value(e64.reshape(-1)[flat])}


def differences(compiled: dict[str, torch.Tensor | None], eager: dict[str, torch.Tensor | None],
                losses: tuple[Any, Any]) -> dict[str, Any]:
    """`st.meta["compare_compiled"]` from both runs' gradients by parameter name, and their losses."""
    params: dict[str, Any] = {}
    worst, worst_abs = None, -1.0
    for name in compiled:
        c, e = compiled[name], eager.get(name)
        if c is None and e is None:
            continue
        if c is None or e is None:
            params[name] = {"missing": "compiled" if c is None else "eager"}
            continue
        d = params[name] = param_difference(c, e)
        m = d["max_abs"] if isinstance(d["max_abs"], float) else math.inf
        if m > worst_abs:
            worst, worst_abs = name, m
    out: dict[str, Any] = {"params": params, "worst": worst,
                           "max_abs": params[worst]["max_abs"] if worst is not None else None}
    lc, le = losses
    if isinstance(lc, torch.Tensor) and isinstance(le, torch.Tensor) and lc.numel() == 1 and le.numel() == 1:
        out["loss"] = {"compiled": _value(lc.detach()), "eager": _value(le.detach())}
    return out
