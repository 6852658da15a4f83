"""One step block as the monitor sees it: the losses, the gradient norms after each backward, what
GradScaler unscaled, and what each optimizer stepped with. See NOTE [Monitor hooks] for how it is seen.

NOTE [Norms before and after clipping]
    After each backward (not `autograd.grad`, which leaves `.grad` alone) the norm of every known
    parameter's gradient is taken in one fused call (`torch._foreach_norm`, as `clip_grad_norm_` does; or
    one extension call, taken again so before a clip: NOTE [Native norms] in grad_norms.py; not where the
    next backward is known to supersede them: NOTE [Superseded norms] in superseded.py);
    GradScaler's unscale takes them again for the gradients it unscaled. These are the norms "as the
    backward left them" (unscaled). When an optimizer steps, its gradients' norms are taken once more:
    those it steps with (after clipping; on a traced step from their summaries: NOTE [Stepped norms read
    from the summaries] in stepped.py). Each total is `vector_norm(stack(norms))` over the optimizer's
    parameters in its order, the very computation of `clip_grad_norm_`, so `grad_norm_before_clip`
    equals what it returned when the loop clipped the same parameters. Nothing is read to the host
    here (NOTE [No sync on CUDA] in `lazy.py`).

NOTE [Read at the post-hook]
    What an optimizer stepped with is read in its step POST-hook: with a closure (`optimizer.step(closure)`:
    LBFGS, Lightning's automatic optimization) the forward, `zero_grad`, backward, GradScaler's unscale
    and clipping all run inside the step, after the pre-hooks. torch's SGD, Adam and AdamW (for-loop,
    foreach and fused; with `maximize` and `weight_decay`) never write `.grad`, except the fused ones
    under GradScaler (`optimizer.grad_scale` set), which unscale it in place: so after the step `.grad`
    holds what was used, unscaled (tests/test_optimizer_steps.py checks both). An optimizer step that
    raises has no post-hook: its record keeps no norms. With GradScaler the scale the gradients were
    produced at is its unscale's (`on_unscale`), or `optimizer.grad_scale` for a fused optimizer.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer.monitor.arrival_norms import arrival_norms
from gradscape.tracer.monitor.grad_norms import Norms, native_norms, norms_of, quick_norms, set_grads, total_of
from gradscape.tracer.monitor.installed import Installed
from gradscape.tracer.monitor.sampling import NormClock
from gradscape.tracer.monitor.stepped import before_map, before_of, norms_stepped, stepped_grads
from gradscape.tracer.monitor.superseded import Superseded
from gradscape.tracer.record.lazy_traces import TableTraces
from gradscape.tracer.record.replay import replay_trigger
from gradscape.tracer.record.roots import root_values
from gradscape.tracer.summary.stats import grad_off

log = logging.getLogger(__name__)


@dataclass
class OptRecord:
    """One optimizer step seen in the block (or one GradScaler unscaled and then skipped)."""

    opt: Any
    name: str
    idx: list[int] = field(default_factory=list)  # known-parameter indices, in the optimizer's order
    lr: list[Any] = field(default_factory=list)
    inv_scale: torch.Tensor | None = None
    found_inf: list[torch.Tensor] = field(default_factory=list)
    stepped: bool = False
    before: Norms | None = None  # per-parameter norms before clipping, unscaled
    total_before: torch.Tensor | float | None = None
    # a float where it is the summary kernel's (NOTE [Stepped norms read from the summaries] in stepped.py)
    total_after: torch.Tensor | float | None = None
    # traced steps: name → summary of what this step used (a `TensorTrace`, or a row of the native tables)
    summaries: dict[str, Any] = field(default_factory=dict)


class StepCapture:
    """The monitor's state for one block; `finish()` removes what it installed."""

    def __init__(self, monitor: Any, step: int, traced: Any, norms: bool = True) -> None:
        self.mon = monitor
        self.step = step
        self.norms = norms  # this step takes the gradient norms (NOTE [Sampled norms] in `sampling.py`)
        self.clock = NormClock()  # the time spent taking them
        # the time spent in the monitor's own calls inside the block, the norms included (`clock` is inside it)
        self.own = NormClock()
        # the Tracer's step context (`Tracer.traced_step`) when the step is traced (scheduled, by trigger, or
        # later by loss)
        self.traced = traced
        self.by_trigger = False  # a loss trigger started the trace inside this block
        self.losses: list[Any] = []  # backward roots: read on the CPU, detached elsewhere (None: not a scalar)
        self.loss_values: list[float | None] = []  # those read on the CPU as they came (`_check_loss`)
        # the norms as each backward (or GradScaler's unscale) left them, in the order taken: (param indices,
        # their norm vector); a later one overrides an earlier one's parameters (`stepped.before_map`)
        self.snaps: list[tuple[list[int], Norms]] = []
        # the latest snapshot when it was read from the arrivals' summaries: (its place in `snaps`, its gradients,
        # weakly held), taken again with torch's fused call if a clip comes (NOTE [Norms after a backward from the
        # arrivals])
        self.soft: tuple[int, list[weakref.ref[torch.Tensor]]] | None = None
        self.records: list[OptRecord] = []
        # traced steps: name → summary of what its optimizer used (a `TensorTrace`, or a row of the native tables);
        # the last step's when one optimizer stepped twice (each step's own: `OptRecord.summaries`)
        self.params_stepped: dict[str, Any] = {}
        # the clipped gradients' norms after each `clip_grad_norm_` / `clip_grad_value_` (NOTE [Clipping seen])
        self.clips: list[tuple[list[int], Norms]] = []
        # what GradScaler unscaled, on a step without norms (its norms are taken if the step was skipped)
        self.unscaled: list[tuple[list[int], list[torch.Tensor]]] = []
        self.params_clipped: dict[str, Any] = {}  # traced steps: name → summary of the gradient as clipped
        self.trigger: tuple[str, dict[str, Any]] | None = None  # what the losses set off in this block
        self.checked = 0  # losses already read and given to the loss rules (on the CPU, as they come)
        self.backwards = 0  # backward calls seen in the block
        self.chain = Superseded(monitor.superseded)  # NOTE [Superseded norms] in superseded.py
        self.installed = Installed(self)

    # ------------------------------------------------------------------ backward
    def on_backward(self, api: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        t0 = perf_counter()  # (inline, not `with self.own`: two Python calls less on every backward)
        k = self.backwards
        self.backwards += 1
        try:
            with _compat.DisableTorchFunction():  # our reads: not through the tracer's mode, when it is on
                self._read_roots(api, args, kwargs)
                if self.norms:
                    self._take_kept(self.chain.at_backward(k, api, self.mon.params))
        except Exception as exc:  # the monitor never breaks a backward
            log.warning("gradscape: the monitor could not read a backward's roots: %s", exc)
        self.own.spent += perf_counter() - t0
        # the recorder is handed the backward here when no mode of its own sees it: a trace a loss started in
        # this backward, or a step run without the mode (NOTE [Carried forwards] in tracer/record/carry.py)
        traced = self.traced
        if traced is None:
            out = func(*args, **kwargs)
        else:
            if self.by_trigger and replay_trigger(self.mon.tracer, traced, api, args, kwargs):
                self.by_trigger = False  # the replay is the trace; this backward is training's (record/replay.py)
            rec = traced.rec if self.by_trigger or traced.rec.forward.carried else None
            out = rec._on_backward(api, func, args, kwargs) if rec is not None else func(*args, **kwargs)
        if self.norms and api != "autograd.grad":
            t0 = perf_counter()  # (both clocks inline: four Python calls less on every backward)
            try:
                with _compat.DisableTorchFunction():
                    idx, grads = set_grads(self.mon.params)
                    if idx and not self.chain.after_backward(k, idx, grads):
                        self._after_backward(idx, grads)
            except Exception as exc:  # the monitor never breaks a backward
                log.warning("gradscape: the monitor could not take the gradients' norms: %s", exc)
            spent = perf_counter() - t0
            self.own.spent += spent
            self.clock.spent += spent
        return out

    def _after_backward(self, idx: list[int], grads: list[torch.Tensor], exact: bool = False) -> None:
        """The snapshot of `grads` (parameters `idx`, as a backward call left them), taken now: read soft where it
        can be, from the extension's norms of small CPU gradients (NOTE [Native norms] in grad_norms.py) or else the
        arrivals' summaries (NOTE [Norms after a backward from the arrivals] in arrival_norms.py), and taken again
        with torch's fused call before a clip (`before_change`); torch's at once before a clip (`exact`), in a loop
        that clips, and where neither read applies."""
        read = None
        if not (exact or self.mon.clipped):
            read = native_norms(grads)
            if read is None:
                read = arrival_norms(self, idx, grads)
        self.soft = None if read is None else (len(self.snaps), list(map(weakref.ref, grads)))
        self.snaps.append((idx, norms_of(grads) if read is None else read))

    def _read_roots(self, api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The backward's roots kept (None: not a scalar), and read and checked on the CPU: read at once there (a
        float), kept detached elsewhere."""
        roots = [None if t is None or t.numel() != 1 else t.item() if t.is_cpu else t.detach()
                 for t in root_values(api, args, kwargs)]  # (`item`: `float` warns of a tensor that needs grad)
        self.losses.extend(roots)
        self._check_loss(roots, len(self.losses) - len(roots))

    def _check_loss(self, roots: list[Any], first: int) -> None:
        """On the CPU the loss is read now (no device to wait for) and a `nonfinite` / `loss_spike`
        traces this very backward; on another device the row is read later and the next step is traced."""
        values: list[float | None] = []
        for r in roots:
            if r is not None and type(r) is not float:  # (on a device: read with the row)
                return
            values.append(r)
        if not values:
            return
        self.loss_values.extend(values)  # read already: a row without norms needs nothing else read (`rows.py`)
        triggers = self.mon.triggers
        hit = triggers.loss_trigger(values, first)
        self.checked = first + len(roots)
        if hit is None or self.trigger is not None:
            return
        self.trigger = hit
        if self.traced is None and triggers.allow(hit[0], self.step):
            triggers.fire(hit[0], self.step)
            self.traced = self.mon.start_trace(self.step, hit[0], hit[1])
            self.by_trigger = True
            self.norms = True  # a traced step has its norms: from this backward's on

    def _snapshot(self, idx: list[int], grads: list[torch.Tensor]) -> None:
        """The norms of the gradients `grads` of parameters `idx`."""
        if idx:
            self.snaps.append((idx, norms_of(grads)))

    def _harden(self, at: int, refs: list[weakref.ref[torch.Tensor]]) -> None:
        """Snapshot `at`, read from summaries, taken again with torch's fused call from its gradients (`refs`), as a
        clip's own norms are (NOTE [Norms after a backward from the arrivals] in arrival_norms.py); not where one of
        them is gone (no longer any parameter's `.grad`: no clip reads it)."""
        self.soft = None
        grads = [g for g in (r() for r in refs) if g is not None]
        vec = self._norms_now(grads) if len(grads) == len(refs) else None
        if vec is not None:
            self.snaps[at] = (self.snaps[at][0], vec)

    def _take_kept(self, kept: tuple[list[int], list[torch.Tensor]] | None, exact: bool = False) -> None:
        """A snapshot kept after a backward (`self.chain`'s answer), taken now (NOTE [Superseded norms] in
        superseded.py), as `_after_backward` takes one (torch's before a clip: `exact`)."""
        if kept is not None and kept[0]:
            try:
                with _compat.DisableTorchFunction(), self.clock:
                    self._after_backward(*kept, exact)
            except Exception as exc:  # the monitor never breaks the loop (a backward, clip, unscale, optimizer step)
                log.warning("gradscape: the monitor could not take the gradients' norms: %s", exc)

    def _norms_now(self, grads: list[torch.Tensor]) -> torch.Tensor | None:
        """torch's fused norms of `grads`, taken now; None where they cannot be (the monitor never breaks a clip)."""
        try:
            with _compat.DisableTorchFunction(), self.clock:
                return norms_of(grads)
        except Exception as exc:
            log.warning("gradscape: the monitor could not take the gradients' norms: %s", exc)
            return None

    # ------------------------------------------------------------------ GradScaler
    def on_unscale(self, args: tuple[Any, ...], opt: Any) -> None:
        """GradScaler has unscaled optimizer `opt`'s gradients (None: not known)."""
        with self.own:
            self._unscaled(args, opt)

    def _unscaled(self, args: tuple[Any, ...], opt: Any) -> None:
        self.mon.scaler_seen = True  # no light step from now on (NOTE [Light steps] in light.py)
        try:
            grads, found_inf, inv_scale = args[0], args[1], args[2]
            if self.traced is not None:  # changed in place unseen (NOTE [Summarised once] in tracer/record/params.py)
                self.traced.rec.params.forget_made()
            rec = self._open_record(opt) if opt is not None else None
            if rec is not None:
                rec.inv_scale = inv_scale
                rec.found_inf.append(found_inf)
            by_grad = {id(p.grad): i for i, p in enumerate(self.mon.params) if p.grad is not None}
            known = [g for g in grads if id(g) in by_grad]
            idx = [by_grad[id(g)] for g in known]
            if self.norms:
                self._snapshot(idx, known)
            else:  # kept until the block ends: their norms are taken if GradScaler skipped the step (`finish`)
                self.unscaled.append((idx, known))
        except Exception as exc:
            log.warning("gradscape: the monitor could not read GradScaler's unscale: %s", exc)

    def _open_record(self, opt: Any) -> OptRecord:
        for r in self.records:
            if r.opt is opt and not r.stepped:
                return r
        r = OptRecord(opt, self.mon.optimizer_name(opt))
        self.records.append(r)
        return r

    # ------------------------------------------------------------------ optimizer steps
    def on_optimizer_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        """An optimizer is about to step. With a closure (LBFGS, Lightning's automatic optimization) the
        forward, backward, unscaling and clipping all run inside the step, after this: the wrappers see
        them and the gradients are read in the post-hook (NOTE [Read at the post-hook])."""
        t0 = perf_counter()  # (inline, not `with self.own`: as `on_backward`)
        self._optimizer_pre(opt)
        self.own.spent += perf_counter() - t0

    def _optimizer_pre(self, opt: Any) -> None:
        try:
            self.before_change()
            rec = self._open_record(opt)
            scale = getattr(opt, "grad_scale", None)  # GradScaler's, for an optimizer that unscales inside
            if isinstance(scale, torch.Tensor):
                rec.inv_scale = 1.0 / scale
                if self.traced is not None:  # it unscales in place (NOTE [Summarised once] in tracer/record/params.py)
                    self.traced.rec.params.forget_made()
        except Exception as exc:
            log.warning("gradscape: the monitor could not read an optimizer step: %s", exc)

    def before_change(self, clip: bool = False) -> None:
        """A clip (`clip`), GradScaler's unscale or an optimizer step is about to run: a traced step's parameter
        gradients still to be summarised are summarised now (NOTE [Settled at the step's end] in
        tracer/record/params.py), and a kept snapshot's norms taken; before a clip, the latest snapshot's with
        torch's fused call if they were read soft (`_after_backward`), and a kept one's so at once."""
        self._take_kept(self.chain.take(), exact=clip)
        if clip and self.soft is not None:
            self._harden(*self.soft)
        if self.traced is None:
            return
        try:
            with _compat.DisableTorchFunction():
                self.traced.rec.settle_params()
        except Exception as exc:  # the monitor never breaks the loop
            log.warning("gradscape: could not read the parameters' gradients: %s", exc)

    def on_optimizer_post(self, opt: Any) -> None:
        """The optimizer has stepped: its gradients are the ones it used (NOTE [Read at the post-hook])."""
        t0 = perf_counter()  # (inline, not `with self.own`: as `on_backward`)
        try:
            # our reads pass through no mode (the tracer's is on in a closure)
            with _compat.DisableTorchFunction():
                self._take_kept(self.chain.take())  # (a closure's last backward)
                self._optimizer_step(opt)
        except Exception as exc:
            log.warning("gradscape: the monitor could not read an optimizer step: %s", exc)
        self.own.spent += perf_counter() - t0

    def _optimizer_step(self, opt: Any) -> None:
        rec = self._open_record(opt)
        rec.stepped = True
        rec.lr = [g.get("lr") for g in opt.param_groups]
        if not self.norms:
            return
        t0 = perf_counter()  # (an exception is `on_optimizer_post`'s to log)
        norms_stepped(self, rec, opt)  # NOTE [Stepped norms read from the summaries] in stepped.py
        self.clock.spent += perf_counter() - t0

    # ------------------------------------------------------------------ clipping
    def on_clip(self, api: str, params: list[Any]) -> None:
        """`clip_grad_norm_` or `clip_grad_value_` has clipped the gradients of `params` (NOTE [Clipping seen]):
        their norms now, for the row's clipped norm, and in a traced step their summaries, which are `st.params`
        for the parameters no optimizer stepped with (an update written by hand: `p.data.add_(p.grad, ...)`)."""
        try:
            with self.own, _compat.DisableTorchFunction():
                index = self.mon._index
                idx: list[int] = []
                grads: list[torch.Tensor] = []
                for p in params:
                    i, g = index.get(id(p)), p.grad
                    if i is not None and g is not None:
                        idx.append(i)
                        grads.append(g)
                if not idx:
                    return
                if self.norms:
                    with self.clock:
                        self.clips.append((idx, quick_norms(grads)))
                if self.traced is not None:
                    with grad_off():
                        self.params_clipped.update(self._summarise(idx, grads))
        except Exception as exc:  # the monitor never breaks the loop's clipping
            log.warning("gradscape: the monitor could not read a %s: %s", api, exc)

    def _summarise(self, idx: list[int], grads: list[torch.Tensor]) -> dict[str, Any]:
        """Name → summary of each gradient (a row of the step's tensor table, made a `TensorTrace` by `as_traces`)."""
        return self.traced.rec.summarise_used(list(map(self.mon.names.__getitem__, idx)), grads)

    def stepped_summaries(self) -> dict[str, Any]:
        """`st.params` as the loop's updates used them, as summaries (`as_traces` makes them traces): the gradients
        clipped in the block (for an update by hand), overridden by what each optimizer stepped with (the last
        step's, for one that stepped twice)."""
        return {**self.params_clipped, **self.params_stepped}

    def as_traces(self, summaries: dict[str, Any]) -> TableTraces:
        """`summaries` as `TensorTrace`s, once the traced step's tables are made (`NativeStep.assemble`): each row of
        the tables made one when read (NOTE [Traces made when read] in tracer/record/lazy_traces.py)."""
        native = self.traced.rec.native if self.traced is not None else None
        table = native.tables.tensors if native is not None and native.tables is not None else None
        if table is None:
            summaries = {name: v for name, v in summaries.items() if not isinstance(v, int)}
        return TableTraces(table, summaries)

    # ------------------------------------------------------------------ the end
    def release(self) -> None:
        """Drop what refers back here (the installed hooks, the trace): the block is over."""
        self.installed.capture, self.traced, self.soft = None, None, None
        self.records, self.snaps, self.clips, self.unscaled = [], [], [], []
        self.params_stepped, self.params_clipped = {}, {}

    def finish(self) -> None:
        """Remove what was installed; keep the unscaled-but-not-stepped records whose GradScaler found
        inf/NaN (skipped steps), with their norms as the backward left them."""
        self.installed.remove()
        self._take_kept(self.chain.take())
        if self.norms:  # what this step's backward calls superseded, and whether it clipped, for the next step's
            self.mon.superseded = tuple(self.chain.seen)
            self.mon.clipped = bool(self.clips)
        kept = []
        for r in self.records:
            if not r.stepped:
                if not r.found_inf or not any(bool((f != 0).any()) for f in r.found_inf):
                    continue
                opt, r.lr = r.opt, [g.get("lr") for g in r.opt.param_groups]
                if not self.norms:  # a skipped step without norms: taken now, to say whose gradients held inf/NaN
                    self.norms = True
                    for idx, grads in self.unscaled:
                        self._snapshot(idx, grads)
                r.idx = stepped_grads(self.mon, opt)[0]
                before = before_map(self.snaps)
                if r.idx and all(i in before for i in r.idx):
                    r.before = before_of(self, r.idx, None)  # (each in a snapshot: no fallback)
                    r.total_before = total_of(r.before)
            kept.append(r)
        self.records = kept
