"""What the framework callbacks share: checking the tracer options they are given, one run name on
every rank, and `StepWindow`, the span of one optimizer step that a callback holds open across the
framework's hooks, as a plain loop's `with tr.step(i):` block spans its micro-batches."""

from __future__ import annotations

import inspect
import uuid
from contextlib import AbstractContextManager
from typing import Any

import torch

import gradscape


def tracer_options(owner: str, sink: Any, every: int, run: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments for `gradscape.Tracer`, checked when the callback is made (the tracer itself
    is made when training starts, on each rank): an unknown option is named at once, not at `fit()`."""
    params = inspect.signature(gradscape.Tracer).parameters
    accepted = [k for k in params if k != "model"]
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())  # Tracer checks them
    unknown = [] if open_ended else sorted(k for k in options if k not in accepted)
    if unknown:
        raise TypeError(f"{owner}: unknown tracer option(s) {unknown}; gradscape.Tracer takes {accepted}")
    if type(every) is not int or every < 1:
        raise ValueError(f"{owner}: every must be a positive int, got {every!r}")
    if run is not None and not isinstance(run, str):
        raise TypeError(f"{owner}: run must be a str or None, got {type(run).__name__}")
    return {"sink": sink, "every": every, "run": run, **options}


def shared_run_name(run: str | None) -> str | None:
    """`run`; or, when it is None under torch.distributed with several ranks, one name that rank 0 picks
    and sends to the others (each rank would otherwise pick its own, and its steps would be a run apart).
    A collective: every rank must call it. The name comes from `uuid`, not from torch's generator, which
    the training loop owns."""
    if run is not None:
        return run
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    on_gpu = dist.get_backend() == "nccl"  # NCCL only moves CUDA tensors; "cpu:gloo,cuda:nccl" takes CPU ones
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    token = torch.tensor([uuid.uuid4().int >> 80], dtype=torch.int64, device=device)  # 48 random bits
    dist.broadcast(token, src=0)
    return f"run-{int(token.item()):012x}"


class StepWindow:
    """One optimizer step of a framework's loop inside `tracer.step(i)`: `open(i)` before the first
    micro-batch's forward, `close()` after the optimizer step and its `zero_grad`. Every window enters
    `tracer.step(i)`, traced or not, as a plain loop's block would; on an untraced step that costs the
    tracer's shared no-op context."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.index: int | None = None
        self._ctx: AbstractContextManager[Any] | None = None

    @property
    def is_open(self) -> bool:
        return self._ctx is not None

    def open(self, index: int) -> None:
        if self._ctx is not None:  # the framework left the last step without its end hook (it raised)
            self.close(RuntimeError(f"gradscape: step {self.index} never reached its optimizer step's end: the "
                                    f"loop started step {index} first"))
        ctx = self.tracer.step(index)
        ctx.__enter__()
        self._ctx, self.index = ctx, index

    def close(self, error: BaseException | None = None) -> None:
        """End the open step, if any; `error` (the exception that ended training) goes into its record."""
        ctx, self._ctx = self._ctx, None
        if ctx is None:
            return
        if error is None:
            ctx.__exit__(None, None, None)
        else:
            ctx.__exit__(type(error), error, error.__traceback__)
