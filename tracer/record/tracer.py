"""`Tracer`: the one object a training loop holds, and `trace()`, its one-call form for notebooks.

Each traced step is recorded by a `StepRecorder` (tracer/record/recorder.py) and goes, once complete,
to every sink (tracer/sinks/: memory, a SQLite file, a live server over http)."""

from __future__ import annotations

import logging
import operator
import uuid
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from gradscape.tracer._model import StepTrace
from gradscape.tracer.record.recorder import StepRecorder
from gradscape.tracer.record.structure import StructureCache
from gradscape.tracer.sinks.base import Sink, resolve_sinks
from gradscape.tracer.summary.summariser import Summariser

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

    `sink`: None (memory only), a `.sqlite`/`.db` path, an `http://` or `https://` URL of a gradscape
    server (live, tracer/sinks/socket.py), an object with `write(StepTrace)` and `close(timeout)`, or a
    list of those. `every=N` traces steps whose index is a multiple of N
    and installs nothing at all on the others. `tensors="full"` also keeps every gradient's values.
    `keep`: how many recent steps the memory sink holds (`tr.steps`). Every kept step is a few hundred
    Python objects per hundred nodes that the cyclic garbage collector re-scans until they are dropped,
    so a small `keep` costs less per traced step.
    """

    def __init__(self, model: torch.nn.Module | None = None, *, sink: Any = None, run: str | None = None,
                 every: int = 1, tensors: str = "summary", thumb: int = 64, keep: int = 2) -> None:
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
        self.sinks: list[Sink] = resolve_sinks(sink, keep=keep, run=self.run)
        self.last: StepTrace | None = None
        self._closed = False
        self._active = False
        self._statics = StructureCache()
        self._warned: set[str] = set()  # what its steps could not trace, warned about once (st.meta["notes"])

    # ------------------------------------------------------------------ steps
    def step(self, i: int) -> AbstractContextManager[StepTrace | None]:
        """Trace step `i` (when `i % every == 0`): forward attribution and every backward inside the
        block. The context yields the `StepTrace`, complete once the block exits, or None on an
        untraced step, for which nothing at all is installed (the context is a shared no-op)."""
        if self._closed:
            raise RuntimeError("this Tracer is closed")
        if type(i) is not int:
            if isinstance(i, bool) or not hasattr(type(i), "__index__"):
                raise TypeError(f"Tracer.step: the step index must be an int, got {type(i).__name__} {i!r}")
            i = operator.index(i)  # numpy integers and the like
        if i % self.every != 0:
            return _UNTRACED
        if self._active:
            raise RuntimeError("Tracer.step blocks cannot be nested")
        return _TracedStep(self, i)

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


class _Untraced:
    """The context of an untraced step: does nothing, costs nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_UNTRACED = _Untraced()


class _TracedStep:
    """The context of a traced step: installs the recorder on enter, assembles and emits on exit."""

    def __init__(self, tracer: Tracer, i: int) -> None:
        self.tracer = tracer
        self.st = StepTrace(run=tracer.run, step=i)
        self.rec = StepRecorder(tracer.run, i, tracer.model, Summariser(tracer.thumb, tracer.tensors == "full"),
                                tracer._statics, tracer._warned)

    def __enter__(self) -> StepTrace:
        self.tracer._active = True
        try:
            self.rec.start()
        except BaseException:
            self.rec.handles.remove()
            self.tracer._active = False
            raise
        return self.st

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        tr = self.tracer
        tr._active = False
        try:
            with self.rec.handles:  # every hook of the step is gone when this block ends, whatever happens in it
                try:
                    done = self.rec.finish(exc)  # removes them first: the step is assembled without them
                except Exception as err:  # never hide the user's exception behind ours
                    warnings.warn(f"gradscape: could not assemble step {self.st.step}: {err}", RuntimeWarning,
                                  stacklevel=2)
                    return None
            _copy_recorded(self.st, done)
            tr.last = self.st
            tr._emit(self.st)
        finally:
            self.rec.collector.resume()  # paused at the first backward (tracer/record/collector.py)
        return None  # never swallow the user's exception


def _copy_recorded(target: StepTrace, src: StepTrace) -> None:
    """Copy what the recorder assembled into the `StepTrace` the `with` block handed out."""
    for f in ("nodes", "edges", "modules", "params", "passes", "execution", "meta", "error", "problems", "rank",
              "world_size"):
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
