"""`Tracer.compare_compiled`: one step run compiled, as training runs it, then eager and traced from the same
state (NOTE [Compare compiled] in tracer/record/compare.py, which computes the differences). It sits above
the monitor and the recorder, whose step contexts it opens one after the other."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from gradscape.tracer._model import StepTrace
from gradscape.tracer.record.compare import TrainingState, differences
from gradscape.tracer.record.model_index import ModelIndex


def compare_compiled(tracer: Any, i: int, closure: Callable[[], Any], traced_step: Callable[[], Any]) -> StepTrace:
    """Run `closure` compiled (training's run) then eager and traced (NOTE [Compare compiled] in
    tracer/record/compare.py); returns the eager trace, with the differences in `st.meta["compare_compiled"]`.
    `traced_step()` makes the Tracer's traced context for the eager run, its compiled regions run eagerly."""

    if tracer.model is None:
        raise ValueError("compare_compiled needs the Tracer's model (its parameters are compared)")
    named = ModelIndex(tracer.model).params
    before = TrainingState(list(tracer.model.buffers()))
    held = [p.grad for p, _ in named]  # training's gradients so far (accumulation), set aside for both runs
    for p, _ in named:
        p.grad = None
    versions = [p._version for p, _ in named]
    mon = tracer._monitor
    step = mon.full_step(i, None, tracer, mon.sampler.due(False)) if mon is not None else nullcontext()
    with step:
        loss_c = closure()
    compiled = {n: p.grad for p, n in named}
    if [p._version for p, _ in named] != versions:
        _put_back(named, held, compiled)
        raise RuntimeError("compare_compiled: the closure changed a parameter (an optimizer step?); it must only "
                           "run the forward and the backward")
    after = TrainingState(list(tracer.model.buffers()))
    before.restore()
    for p, _ in named:
        p.grad = None
    traced = traced_step()
    losses: list[Any] = [loss_c, None]
    traced.before_emit = lambda st: st.meta.__setitem__(
        "compare_compiled", differences(compiled, {n: p.grad for p, n in named}, (losses[0], losses[1])))
    try:
        with traced:
            losses[1] = closure()
    finally:
        after.restore()
        _put_back(named, held, compiled)
    return traced.st


def _put_back(named: list[tuple[torch.Tensor, str]], held: list[Any], compiled: dict[str, Any]) -> None:
    """Each `.grad` as the compiled run's backward would have left it: added in place to a gradient held before."""
    with torch.no_grad():
        for (p, n), g0 in zip(named, held):
            g = compiled[n]
            if g0 is None or g is None:
                p.grad = g if g0 is None else g0
            else:
                p.grad = g0.add_(g)
