"""`Tracer`: the one object a training loop holds, and `trace()`, its one-call form for notebooks."""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from tracer._model import StepTrace
from tracer._recorder import StepRecorder
from tracer._sinks import Sink, resolve_sinks
from tracer._summary import Summariser

log = logging.getLogger(__name__)

_TENSOR_MODES = ("summary", "full")


class Tracer:
    """Records the autograd graph and every gradient of the steps it is asked to trace.

    >>> tr = Tracer(model, sink="run.sqlite", every=10)
    >>> for i, (x, y) in enumerate(loader):
    ...     with tr.step(i) as st:        # st is None on steps that are not traced
    ...         loss = F.cross_entropy(model(x), y)
    ...         loss.backward()
    ...     opt.step(); opt.zero_grad()

    `sink`: None (memory only), a `.sqlite`/`.db` path, an object with `write(StepTrace)` and
    `close(timeout)`, or a list of those. `every=N` traces steps whose index is a multiple of N
    and installs nothing at all on the others. `tensors="full"` also keeps every gradient's values.
    """

    def __init__(self, model: torch.nn.Module | None = None, *, sink: Any = None, run: str | None = None,
                 every: int = 1, tensors: str = "summary", thumb: int = 64, keep: int = 8) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int, got {every!r}")
        if tensors not in _TENSOR_MODES:
            raise ValueError(f"tensors must be one of {_TENSOR_MODES}, got {tensors!r}")
        if not isinstance(thumb, int) or thumb < 0:
            raise ValueError(f"thumb must be a non-negative int, got {thumb!r}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        self.model = model
        self.run = run or f"run-{uuid.uuid4().hex[:8]}"
        self.every = every
        self.tensors = tensors
        self.thumb = thumb
        self.sinks: list[Sink] = resolve_sinks(sink, keep=keep)
        self.last: StepTrace | None = None
        self._closed = False
        self._active = False

    # ------------------------------------------------------------------ steps
    def should_trace(self, i: int) -> bool:
        return i % self.every == 0

    @contextmanager
    def step(self, i: int) -> Iterator[StepTrace | None]:
        """Trace step `i` (when `i % every == 0`): forward attribution and every backward inside the
        block. Yields the `StepTrace`, complete once the block exits; yields None when untraced."""
        if self._closed:
            raise RuntimeError("this Tracer is closed")
        if not self.should_trace(i):
            yield None
            return
        if self._active:
            raise RuntimeError("Tracer.step blocks cannot be nested")
        st = StepTrace(run=self.run, step=int(i))
        rec = StepRecorder(self.run, int(i), self.model, Summariser(self.thumb, self.tensors == "full"))
        self._active = True
        error: BaseException | None = None
        try:
            rec.start()
            yield st
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._active = False
            try:
                done = rec.finish(error)
            except Exception as exc:  # never hide the user's exception behind ours
                rec.stop_hooks()
                warnings.warn(f"gradscape: could not assemble step {i}: {exc}", RuntimeWarning, stacklevel=3)
                done = None
            if done is not None:
                _fill(st, done)
                self.last = st
                self._emit(st)

    def _emit(self, st: StepTrace) -> None:
        for sink in self.sinks:
            try:
                sink.write(st)
            except Exception as exc:  # a sink must never break training
                log.warning("gradscape: sink %s failed on step %s: %s", type(sink).__name__, st.step, exc)

    # ------------------------------------------------------------------ lifecycle
    @property
    def stats(self) -> dict[str, int]:
        """Counts summed over sinks: steps written/sent, spilled and dropped."""
        total: dict[str, int] = {"sent": 0, "spilled": 0, "dropped": 0}
        for s in self.sinks:
            for k, v in getattr(s, "stats", {}).items():
                total[k] = total.get(k, 0) + int(v)
        return total

    def close(self, timeout: float = 10.0) -> None:
        """Flush and close every sink. Idempotent; never raises for a sink's failure."""
        if self._closed:
            return
        self._closed = True
        for sink in self.sinks:
            try:
                sink.close(timeout)
            except Exception as exc:
                log.warning("gradscape: closing sink %s failed: %s", type(sink).__name__, exc)

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def steps(self) -> Sequence[StepTrace]:
        """Steps kept by the memory sink (the most recent `keep`)."""
        for s in self.sinks:
            kept = getattr(s, "steps", None)
            if kept is not None:
                return list(kept)
        return []


def _fill(target: StepTrace, src: StepTrace) -> None:
    for f in ("nodes", "edges", "modules", "params", "passes", "execution", "meta", "error"):
        setattr(target, f, getattr(src, f))


def trace(loss: torch.Tensor, model: torch.nn.Module | None = None, **opts: Any) -> StepTrace:
    """Run `loss.backward()` under a one-step tracer and return its `StepTrace`.

    The forward already ran, so nodes carry no module or source line unless the graph can tell
    (parameters are still named when `model` is given). Options are those of `Tracer`.
    """
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"trace() needs the loss tensor, got {type(loss).__name__}")
    gradient = opts.pop("gradient", None)
    with Tracer(model, **opts) as tr, tr.step(0) as st:
        loss.backward(gradient)
    assert st is not None
    return st
