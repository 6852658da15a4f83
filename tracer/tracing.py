"""`Tracer`: the one object a training loop holds, and `trace()`, its one-call form for notebooks.

Each traced step is recorded by a `StepRecorder` (tracer/record/recorder.py) and goes, once complete,
to every sink (tracer/sinks/: memory, a SQLite file, a live server over http)."""

from __future__ import annotations

import logging
import operator
import uuid
import warnings
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from gradscape.tracer._model import StepTrace
from gradscape.tracer.monitor import Monitor, as_module
from gradscape.tracer.record import patched_calls
from gradscape.tracer.record.carry import ForwardCarry
from gradscape.tracer.record.compiled import COMPILED_MODES, EagerRegions, compiled_meta
from gradscape.tracer.record.handles import CallOnRemove
from gradscape.tracer.record.handoff import Handoff
from gradscape.tracer.record.model_index import IndexCache
from gradscape.tracer.record.native import status as native_status
from gradscape.tracer.record.recorder import StepRecorder
from gradscape.tracer.record.replay import ForwardSnapshot, Replayable
from gradscape.tracer.record.structure import StructureCache
from gradscape.tracer.sinks.base import Sink, resolve_sinks
from gradscape.tracer.summary.budget import DEFAULT_BUDGET, apply_thumb_budget
from gradscape.tracer.summary.summariser import Summariser

log = logging.getLogger(__name__)

_TENSOR_MODES = ("summary", "full")


class Tracer:
    """Records the autograd graph and every gradient of the steps it is asked to trace.

        tr = Tracer(model, sink="run.sqlite", every=10)
        for i, (x, y) in enumerate(loader):
            with tr.step(i) as st:        # st is None on steps that are not traced
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            opt.step(); opt.zero_grad()

    `sink`: None (memory only), a `.sqlite`/`.db` path, an `http://` or `https://` URL of a gradscape
    server (live, tracer/sinks/socket.py), an object with `write(StepTrace)` and `close(timeout)`, or a
    list of those. `every=N` traces steps whose index is a multiple of N; on the others only the monitor
    is installed (nothing at all with `monitor=False`). `tensors="full"` also keeps every gradient's values.
    `model`: a module, or a list, tuple or dict of modules (names stay apart: "0.fc.weight", "G.fc.weight").
    `monitor=True` (the default) records a history row on every step, traced or not (`tr.history`, and
    `write_history` of the sinks that take it), and `triggers` (True, False, a list of names or a
    `Triggers`) trace the steps that go wrong when `every` did not schedule them: see tracer/monitor/.
    `keep`: how many recent steps the memory sink holds (`tr.steps`). Every kept step is a few hundred
    Python objects per hundred nodes that the cyclic garbage collector re-scans until they are dropped,
    so a small `keep` costs less per traced step. `thumb_budget`: bytes of thumbnails a step keeps
    (one byte a cell, as the trace file stores them); past it the smallest-norm gradients keep their
    statistics only, and `st.meta["thumbs_left_out"]` says how many (NOTE [Thumbnail budget] in
    tracer/summary/budget.py). None keeps every thumbnail. `run`: the run's name in the sinks (default:
    a new `run-<hex>`); `thumb`: a thumbnail's largest side in cells (64: at most 64×64 block means).
    A backward call that repeats an earlier call of its step (from a root of the same kind, as many new
    nodes, no new parameter: a micro-batch, a GAN's second batch) gets thumbnails of half that side;
    `thumb=(64, 64)` sets both sizes (NOTE [Repeated calls' thumbnails] in tracer/record/call_thumbs.py).
    `tr.last` is the last step traced (by `every` or a trigger), `tr.steps` the ones the memory sink keeps.
    `recorder`: "native" (the C++ recorder, NOTE [Native recorder] in tracer/record/native.py; an error
    when it is not built) or "python"; by default the native one when it is built, else the Python one.
    A step the native recorder cannot record (`tensors="full"`, a breakpoint set) is recorded in Python:
    `st.meta["recorder"]` says which recorder ran and, when Python stood in, why ("python (why)").
    `compiled`: "eager" (the default) runs a compiled model's traced steps eagerly, so their trace has every
    op of its compiled regions; "opaque" leaves them compiled, each region one node (see
    tracer/record/compiled.py, NOTE [Compiled regions on a traced step]).
    `norms_every`: the monitor takes the gradient norms every k-th step, k chosen from their measured cost
    so that they cost at most 3% of a step (None, the default), or this k (1: every step); the losses and
    GradScaler's skips are checked on every step (NOTE [Sampled norms] in tracer/monitor/sampling.py).
    """

    def __init__(self, model: Any = None, *, sink: Any = None, run: str | None = None,
                 every: int = 1, tensors: str = "summary", thumb: int | tuple[int, int] = 64, keep: int = 2,
                 thumb_budget: int | None = DEFAULT_BUDGET, monitor: bool = True, triggers: Any = True,
                 recorder: str | None = None, compiled: str = "eager",
                 norms_every: int | None = None) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int, got {every!r}")
        if tensors not in _TENSOR_MODES:
            raise ValueError(f"tensors must be one of {_TENSOR_MODES}, got {tensors!r}")
        self.thumb, self.repeat_thumb = _thumb_sizes(thumb)
        if thumb_budget is not None and (type(thumb_budget) is not int or thumb_budget < 0):
            raise ValueError(f"thumb_budget must be a non-negative int (bytes) or None, got {thumb_budget!r}")
        self.recorder = _recorder(recorder)
        if compiled not in COMPILED_MODES:
            raise ValueError(f"compiled must be one of {COMPILED_MODES}, got {compiled!r}")
        self.compiled = compiled
        self.model = as_module(model)  # monitor: a list, tuple or dict of models becomes one container
        self.run = run or f"run-{uuid.uuid4().hex[:8]}"
        self.every = every
        self.tensors = tensors
        self.thumb_budget = thumb_budget
        self.sinks: list[Sink] = resolve_sinks(sink, keep=keep, run=self.run)
        self.last: StepTrace | None = None
        self._closed = False
        self._active = False
        self._statics = StructureCache()
        self._names = IndexCache()  # NOTE [Index kept] in tracer/record/model_index.py
        self._warned: set[str] = set()  # what its steps could not trace, warned about once (st.meta["notes"])
        # the every-step monitor (tracer/monitor/)
        self._monitor = Monitor(self, triggers, norms_every) if monitor else None
        # the monitor's native light step, whose fast path opens the light steps it allows (None once closed)
        self._fast = self._monitor.light.native if self._monitor is not None else None
        # a repeated forward's attribution, carried between steps (NOTE [Carried forwards] in tracer/record/carry.py):
        # the wrapped backward calls see a backward without the mode, the monitor's capture or, without the
        # monitor, the traced step's own (NOTE [Backward handoff] in tracer/record/handoff.py), the wrappers
        # held in place between the steps as the monitor holds them
        self._carry = ForwardCarry()
        self._hold = None if monitor else patched_calls.Hold()
        if self._hold is not None:
            weakref.finalize(self, self._hold.release)
        # the model's calls, kept for a loss trigger's replay (NOTE [Replayed loss triggers] in tracer/record/replay.py)
        kinds = self._monitor.triggers.cfg.kinds if self._monitor is not None else ()
        loss_triggers = bool({"nonfinite", "loss_spike"} & set(kinds))
        self._snapshot = ForwardSnapshot(self.model) if loss_triggers and self.model is not None else None

    # ------------------------------------------------------------------ steps
    def step(self, i: int) -> AbstractContextManager[StepTrace | None]:
        """Trace step `i` (when `i % every == 0`, or when a trigger asks): forward attribution and every
        backward inside the block. The context yields the `StepTrace`, complete once the block exits, or
        None on an untraced step, for which only the monitor is installed (nothing with `monitor=False`: the
        context is a shared no-op; the wrapped backward functions stay in place while the Tracer lives, and
        pass such a step's calls straight through: NOTE [Backward handoff] in tracer/record/handoff.py). A light
        step the monitor allowed ahead is opened by its native block alone (NOTE [Native light steps] in
        tracer/monitor/light_native.py)."""
        fast = self._fast  # NOTE [Native light steps] in tracer/monitor/light_native.py
        if fast is not None and (block := fast.fast_open(i, self)) is not None:
            return block  # type: ignore[no-any-return]
        if self._closed:
            raise RuntimeError("this Tracer is closed")
        if type(i) is not int:
            if isinstance(i, bool) or not hasattr(type(i), "__index__"):
                raise TypeError(f"Tracer.step: the step index must be an int, got {type(i).__name__} {i!r}")
            i = operator.index(i)  # numpy integers and the like
        if self._active:
            raise RuntimeError("Tracer.step blocks cannot be nested")
        scheduled = i % self.every == 0  # the one place `every` is read; the monitor adds triggered steps
        if self._monitor is not None:  # every step: a history row, and triggered traces (tracer/monitor/)
            inner = self._monitor.step(i, scheduled, self)
            if inner.light:  # NOTE [Light steps] in tracer/monitor/light.py
                return inner
            if self._snapshot is None or inner.traced is not None:
                return _Busy(self, inner)
            return Replayable(_Busy(self, inner), self._snapshot)  # a loss trigger may replay its forward
        return self.traced_step(i) if scheduled else _UNTRACED

    def traced_step(self, i: int) -> _TracedStep:
        """The recorder's context for step `i`, not yet entered: what `step` returns for a scheduled step,
        and what the monitor opens inside its own context for a scheduled or triggered one."""
        return _TracedStep(self, i)

    def compare_compiled(self, i: int, closure: Callable[[], Any]) -> StepTrace:
        """Step `i` computed twice from the same state: compiled, as training runs it, then eager and traced.
        `closure` runs the forward and the backward (and may return the loss), as an optimizer's closure
        does; training is left where the compiled run left it. Returns the eager run's trace, with each
        parameter's gradient difference in `st.meta["compare_compiled"]` (NOTE [Compare compiled] in
        tracer/record/compare.py)."""
        if self._closed:
            raise RuntimeError("this Tracer is closed")
        if self._active:
            raise RuntimeError("compare_compiled cannot run inside a Tracer.step block")
        from gradscape.tracer.compare_step import compare_compiled

        i = operator.index(i)
        return compare_compiled(self, i, closure, lambda: _TracedStep(self, i, compiled="eager"))

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
        self._fast = None
        if self._hold is not None:
            self._hold.release()
        if self._monitor is not None:
            try:  # the history rows not yet written go first
                self._monitor.close()
            except Exception as exc:
                log.warning("gradscape: the monitor could not flush its history: %s", exc)
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
    def history(self) -> list[dict[str, Any]]:
        """The monitor's rows of the recent steps (the last 10,000), as `TraceStore.history` gives them;
        rows still being read from the device (NOTE [No sync on CUDA]) come once they arrive."""
        return [] if self._monitor is None else self._monitor.history()

    @property
    def steps(self) -> Sequence[StepTrace]:
        """Steps kept by the memory sink (the most recent `keep`)."""
        for s in self.sinks:
            kept = getattr(s, "steps", None)
            if kept is not None:
                return list(kept)
        return []


def _recorder(asked: str | None) -> str:
    """The recorder a Tracer uses: "native", "python", or "python (why not the native one)" by default."""
    if asked not in (None, "native", "python"):
        raise ValueError(f"recorder must be 'native', 'python' or None (the native one when it is built), "
                         f"got {asked!r}")
    if asked == "python":
        return asked
    built, why = native_status()
    if built:
        return "native"
    if asked == "native":
        raise RuntimeError(f"Tracer(recorder='native'): the native recorder cannot be used: {why}")
    return f"python ({why})"


class _Untraced:
    """The context of an untraced step: does nothing, costs nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_UNTRACED = _Untraced()


class _Busy:
    """A monitored step's context (the monitor's, `inner`), with the Tracer marked busy while it is open, so
    that a nested `step` is refused."""

    __slots__ = ("inner", "tracer")

    def __init__(self, tracer: Tracer, inner: AbstractContextManager[StepTrace | None]) -> None:
        self.tracer = tracer
        self.inner = inner

    def __enter__(self) -> StepTrace | None:
        self.tracer._active = True
        try:
            return self.inner.__enter__()
        except BaseException:
            self.tracer._active = False
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            self.inner.__exit__(*exc)
        finally:
            self.tracer._active = False
        return None  # never swallow the user's exception


class _TracedStep:
    """The context of a traced step: installs the recorder on enter, assembles and emits on exit."""

    def __init__(self, tracer: Tracer, i: int, compiled: str | None = None) -> None:
        self.tracer = tracer
        self.compiled = compiled or tracer.compiled  # NOTE [Compiled regions on a traced step]
        self.st = StepTrace(run=tracer.run, step=i)
        summ = Summariser(tracer.thumb, tracer.tensors == "full", tracer.repeat_thumb)
        summ.budget = tracer.thumb_budget
        self.rec = StepRecorder(tracer.run, i, tracer._names.index(tracer.model), summ, tracer._statics,
                                tracer._warned, tracer._carry, tracer.recorder)
        self.before_emit: Callable[[StepTrace], None] | None = None  # the monitor's additions (tracer/monitor/)
        # NOTE [Compiled regions on a traced step] in tracer/record/compiled.py (None: not entered, or "opaque")
        self.regions: EagerRegions | None = None
        self.replayed: dict[str, Any] | None = None  # NOTE [Replayed loss triggers] in tracer/record/replay.py
        # without the monitor, the step's own capture of the backward calls (NOTE [Backward handoff])
        self.handoff = Handoff(self.rec) if tracer._monitor is None else None

    def __enter__(self) -> StepTrace:
        self.tracer._active = True
        try:
            if self.compiled == "eager":
                self.regions = EagerRegions()
                self.regions.start()
            self.rec.start()
            if self.handoff is not None:
                patched_calls.install(self.handoff)
                self.rec.handles.add(CallOnRemove(lambda: patched_calls.uninstall(self.handoff)))
        except BaseException:
            if self.regions is not None:
                self.regions.stop()
            self.rec.handles.remove()
            self.rec.collector.resume()
            self.tracer._active = False
            raise
        return self.st

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        tr = self.tracer
        tr._active = False
        if self.regions is not None:
            self.regions.stop()  # compiled callables compile again from here on
        try:
            with self.rec.handles:  # every hook of the step is gone when this block ends, whatever happens in it
                try:
                    self.rec.finish(exc, self.st)  # removes them first: the step is assembled without them
                except Exception as err:  # never hide the user's exception behind ours
                    warnings.warn(f"gradscape: could not assemble step {self.st.step}: {err}", RuntimeWarning,
                                  stacklevel=2)
                    return None
            apply_thumb_budget(self.st, tr.thumb_budget, self.rec.summ.thumb_cells)
            compiled = compiled_meta(self.st.nodes, self.regions)
            if compiled is not None:
                self.st.meta["compiled"] = compiled
            if self.replayed is not None:
                self.st.meta["replay"] = self.replayed
            if self.before_emit is not None:
                try:
                    self.before_emit(self.st)
                except Exception as err:
                    log.warning("gradscape: the monitor could not complete step %s: %s", self.st.step, err)
            tr.last = self.st
            tr._emit(self.st)
        finally:
            self.rec.collector.resume()  # paused at the step's start (tracer/collector.py)
        return None  # never swallow the user's exception


def trace(loss: torch.Tensor, model: torch.nn.Module | None = None, **opts: Any) -> StepTrace:
    """Run `loss.backward()` under a one-step tracer and return its `StepTrace`.

    The forward already ran, so nodes carry no module or source line unless the graph can tell
    (parameters are still named when `model` is given). Options are those of `Tracer`.
    """
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"trace() needs the loss tensor, got {type(loss).__name__}")
    gradient = opts.pop("gradient", None)
    opts.setdefault("monitor", False)  # one backward, no training loop: nothing to monitor
    with Tracer(model, **opts) as tr, tr.step(0) as st:
        loss.backward(gradient)
    assert st is not None
    return st


def _thumb_sizes(thumb: Any) -> tuple[int, int]:
    """`thumb` as (a step's first calls' size, repeated calls' size): an int n is (n, n / 2 rounded up)."""
    sizes = (thumb, (thumb + 1) // 2) if type(thumb) is int else thumb
    if not (isinstance(sizes, tuple) and len(sizes) == 2 and all(type(n) is int and n >= 0 for n in sizes)):
        raise ValueError(f"thumb must be a non-negative int or a pair of them (first calls, repeated calls), "
                         f"got {thumb!r}")
    return sizes
