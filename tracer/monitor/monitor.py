"""The every-step monitor of one Tracer: a history row for every step inside `tr.step(i)`, traced or
not, and the triggers that trace a step nobody scheduled (NOTE [Trigger rules] in `triggers.py`).

Rows are kept in memory (`Tracer.history`, the last `KEEP_ROWS`) and written to the sinks in batches
(`write_history`): every `FLUSH_ROWS` rows, at least every `FLUSH_SECONDS`, on every traced step and
at `close()`, so an untraced step costs no write of its own.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import deque
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer._model import fill
from gradscape.tracer.monitor.capture import StepCapture
from gradscape.tracer.monitor.full import MonitoredStep
from gradscape.tracer.monitor.kept_rows import KeptRows
from gradscape.tracer.monitor.light import LightStep
from gradscape.tracer.monitor.light_native import native_light
from gradscape.tracer.monitor.light_rows import LightRows, learning_rates
from gradscape.tracer.monitor.problems import amp_problem, rising_layer, spike_problem
from gradscape.tracer.monitor.rows import (
    PendingRow,
    blank_row,
    host_row,
    pending_row,
    plain_row,
    resolve,
    row_without_norms,
)
from gradscape.tracer.monitor.sampling import TIMED, NormSampler
from gradscape.tracer.monitor.triggers import Triggers, TriggerState, finite
from gradscape.tracer.record import patched_calls
from gradscape.tracer.record.lazy_traces import held_entries
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.record.params import in_order
from gradscape.tracer.wire.history import WireHistoryRow, history_to_wire, row_as_dict

log = logging.getLogger(__name__)

KEEP_ROWS = 10_000
FLUSH_ROWS = 64
FLUSH_SECONDS = 1.0


class Monitor:
    def __init__(self, tracer: Any, triggers: Any, norms_every: int | None = None) -> None:
        # the Tracer owns its monitor: a proxy back, so that a Tracer dropped is freed at once with its model (a
        # cycle would keep a DDP model, and its process group, until the garbage collector or the interpreter's
        # exit, where gloo's teardown aborted the process: tests/test_distributed.py)
        self.tracer: Any = weakref.proxy(tracer)
        # the backward calls' wrappers stay in place between blocks until the Tracer is closed or collected
        self._hold = patched_calls.Hold()  # (NOTE [Patched backward] in tracer/record/patched_calls.py)
        weakref.finalize(tracer, self._hold.release)
        self.triggers = TriggerState(Triggers.resolve(triggers))
        self.sampler = NormSampler(norms_every)  # which steps take the gradient norms (NOTE [Sampled norms])
        self.superseded: tuple[bool, ...] = ()  # the last step's (NOTE [Superseded norms] in superseded.py)
        self.clipped = False  # the last full step clipped (NOTE [Norms after a backward from the arrivals])
        self.params: list[Any] = []
        self.names: list[str] = []
        self._index: dict[int, int] = {}  # id of a parameter (held in `params`) → its index
        if tracer.model is not None:  # named as a traced step names them (a compiled model's too)
            for p, n in ModelIndex(tracer.model).params:
                self._add(p, n)
        self._opt_names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self.optimizers: list[tuple[Any, str]] = []  # (a weak reference, its name) of each optimizer seen stepping
        self.scaler_seen = False  # a GradScaler unscaled in a block: no light step from then on (NOTE [Light steps])
        self._opt_counts: dict[str, int] = {}
        self.pending: deque[PendingRow] = deque()
        self.kept = KeptRows(KEEP_ROWS)  # the history rows kept, and those not yet written (NOTE [Kept rows])
        self.light = LightRows()  # light steps' rows on their way to `kept` (NOTE [Light rows] in light_rows.py)
        self.free: LightStep | None = None  # the light step's context, closed, to hand out again
        self.light.native = native_light(self, FLUSH_SECONDS)  # the light step in C++ (NOTE [Native light steps])
        self._last_flush = time.monotonic()
        self.window: deque[tuple[int, list[float | None]]] = deque(maxlen=self.triggers.cfg.window)
        self.found: dict[int, list[tuple[str, dict[str, Any]]]] = {}  # step → what its row set off
        self.trace_of: dict[int, tuple[str, dict[str, Any]]] = {}  # traced step → the trigger behind it
        self.trigger_meta: dict[int, dict[str, Any]] = {}  # triggered step → st.meta["trigger"]

    # ------------------------------------------------------------------ names
    def _add(self, p: Any, name: str) -> int:
        self._index[id(p)] = len(self.params)
        self.params.append(p)
        self.names.append(name)
        return len(self.params) - 1

    def index_of(self, p: Any, opt: Any, group: int, k: int) -> int:
        """The parameter's index; one that no model named gets its optimizer's name and place."""
        i = self._index.get(id(p))
        return i if i is not None else self._add(p, f"{self.optimizer_name(opt)}.param_groups.{group}.{k}")

    def optimizer_name(self, opt: Any) -> str:
        """The class name; a second optimizer of the same class is "Adam#1", a third "Adam#2"."""
        name = self._opt_names.get(opt)
        if name is None:
            cls = type(opt).__name__
            n = self._opt_counts.get(cls, 0)
            self._opt_counts[cls] = n + 1
            name = self._opt_names[opt] = cls if n == 0 else f"{cls}#{n}"
            self.optimizers.append((weakref.ref(opt), name))
        return name

    # ------------------------------------------------------------------ steps
    def step(self, i: int, scheduled: bool, owner: Any) -> Any:
        """Step `i`'s block, traced when the Tracer `scheduled` it or a trigger asks; `owner`, the Tracer
        itself, which the block holds while it is open (`tracer` is a proxy: `with Tracer(model).step(0)`
        leaves no other reference to it). The trace is the Tracer's own context (`Tracer.traced_step`)."""
        self.sync_fast()
        if self.pending:  # (a step's rows are all taken at its end, but on the CPU: nothing to resolve)
            self.resolve_ready()
        trig = self.triggers.pending
        self.triggers.pending = None
        traced = None
        if scheduled:
            traced = owner.traced_step(i)
        elif trig is not None and self.triggers.allow(trig[0], i):
            self.triggers.fire(trig[0], i)
            traced = self.start_trace(i, trig[0], trig[2])
        if traced is not None and trig is not None:
            self.trace_of.setdefault(i, (trig[0], trig[2]))
        norms = self.sampler.due(traced is not None)  # NOTE [Sampled norms] in sampling.py
        if not norms and traced is None and not self.scaler_seen:  # NOTE [Light steps] in light.py
            timed = self.sampler.steps % TIMED == 0
            rows = self.light
            if (rows.native is not None and rows.groups is not None and rows.opts == len(self.optimizers)
                    and not self.pending and patched_calls.placed()):  # (a Python light step places the wrappers)
                if rows.rows:  # (a Python light step's row: before the block's, NOTE [Native light steps])
                    self.drain()
                fast = self.sampler.light_run() if self.triggers.pending is None else 0
                block = rows.native.open(i, owner, timed, fast, self.sampler.steps, owner.every)
                if block is not None:  # (else handed out and not closed: a Python light step, as below)
                    return block
            light = self.free
            if light is None:
                light = LightStep()
            else:
                self.free = None
            return light.open(self, i, owner, timed)
        return self.full_step(i, traced, owner, norms)

    def sync_fast(self) -> None:
        """The light steps `Tracer.step` took through the native block's fast path told to the sampler, and no more
        allowed until the next native light step (NOTE [Native light steps] in light_native.py)."""
        native = self.light.native
        if native is not None:
            taken = native.take_fast()
            if taken:
                self.sampler.skip(taken)

    def full_step(self, i: int, traced: Any, owner: Any, norms: bool) -> MonitoredStep:
        """Step `i`'s full block (its row after every light row kept before it: NOTE [Light rows])."""
        if self.light.waiting():
            self.drain()
        self.light.refresh(self.optimizers)
        return MonitoredStep(self, i, traced, owner, norms)

    def start_trace(self, i: int, kind: str, details: dict[str, Any]) -> Any:
        ts = self.tracer.traced_step(i)
        fill(ts.st, trigger=kind)
        self.trigger_meta[i] = {"reason": kind, **{k: _plain(v) for k, v in details.items() if k != "layer"}}
        self.trace_of[i] = (kind, details)
        return ts

    def end_step(self, cap: StepCapture, exc_info: tuple[Any, Any, Any]) -> None:
        steps: list[Any] = []  # what each optimizer stepped with, when the row joined now
        try:
            steps = self._row(cap)
        except Exception as exc:
            log.warning("gradscape: the monitor could not record step %s: %s", cap.step, exc)
        ts = cap.traced
        if ts is None:
            if self.pending:
                self.resolve_ready()
            elif self.kept.n_unsent:
                self._maybe_flush()
            return
        steps = self.resolve_ready(force=True).get(cap.step, steps)
        ts.rec.params.replaced = cap.params_stepped.keys() | cap.params_clipped.keys()  # NOTE [Parameter gradients]
        ts.before_emit = lambda st: self._fill_trace(st, cap, steps)
        try:
            ts.__exit__(*exc_info)
        finally:
            ts.before_emit = None
        self.flush(force=True)

    def _row(self, cap: StepCapture) -> list[Any]:
        """The block's row: joined now where no row waits before it and its numbers are on the host (`plain_row`, else
        `host_row`: then what each optimizer stepped with is returned), else pending (`resolve_ready`)."""
        n = len(self.params)
        if not self.pending:
            plain = plain_row(cap, n)
            if plain is not None:  # nothing to wait for, no trigger to look at: the row joins the history now
                self._take_plain(plain)
                return []
        with _compat.DisableTorchFunction():  # our own reads: not through the tracer's mode, still on
            now = None if self.pending else host_row(cap, n, self.names)
            if now is None:
                self.pending.append(pending_row(cap, n, self.names))
                return []
        wire, steps, losses = now
        self._take(cap.step, cap.traced is not None, cap.checked, wire, losses)
        return steps

    def _fill_trace(self, st: Any, cap: StepCapture, steps: list[Any]) -> None:
        # what each optimizer stepped with (NOTE [Parameter gradients] in tracer/record/params.py), in the model's order
        # of its parameters (the recorders differ in which entries the step replaced, and when each was first listed)
        fill(st, params=cap.as_traces(in_order({**held_entries(st.params), **cap.stepped_summaries()}, self.names)))
        for o, r in zip(steps, cap.records):  # (the same records, in the same order: `pending_row`)
            o.grads = cap.as_traces(r.summaries)
        fill(st, optimizer_steps=steps)
        meta = self.trigger_meta.pop(st.step, None)
        if meta is not None:  # why it was traced: the reason, the step that set it off, the numbers
            meta.setdefault("step", st.step)
            st.meta["trigger"] = meta
        found = list(self.found.pop(st.step, []))
        behind = self.trace_of.pop(st.step, None)
        if behind is not None and behind[1].get("step", st.step) != st.step:
            found.insert(0, behind)
        problems = []
        for kind, d in found:
            if kind in ("loss_spike", "grad_spike"):
                problems.append(spike_problem(st, kind, d, self.names))
            elif kind == "amp_skipped":
                problems.append(amp_problem(st, d))
        st.problems[:0] = problems

    # ------------------------------------------------------------------ rows
    def resolve_ready(self, force: bool = False) -> dict[int, list[Any]]:
        """Turn the rows whose numbers have arrived into history (all of them when `force`)."""
        done: dict[int, list[Any]] = {}
        while self.pending and (force or self.pending[0].nums.ready()):
            row = self.pending.popleft()
            try:
                wire, steps, losses = resolve(row)
                self._take(row.step, row.traced, row.checked, wire, losses)
                done[row.step] = steps
            except Exception as exc:
                log.warning("gradscape: the monitor could not read step %s: %s", row.step, exc)
        if self.kept.n_unsent:
            self._maybe_flush()
        return done

    def _maybe_flush(self) -> None:
        if self.kept.n_unsent >= FLUSH_ROWS or time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def take_light(self, step: LightStep) -> bool:
        """A light step's row (NOTE [Light steps] in light.py): kept for a batch when its losses were read on the CPU
        and no row waits before it (NOTE [Light rows] in light_rows.py), else pending; True when a batch joined."""
        self.sync_fast()
        light = self.light
        if light.opts != len(self.optimizers):  # (an optimizer first seen stepping on the last full step)
            self.drain()
            light.refresh(self.optimizers)
        groups = light.groups
        lr: Any = [g["lr"] for g in groups] if groups is not None else learning_rates(self.optimizers)
        if not (step.on_device or self.pending or step.found_inf):
            if light.add(step.step, step.losses, lr) or time.monotonic() - light.since >= FLUSH_SECONDS:
                self.drain()
                return True
            return False
        self.drain()
        if type(lr) is list:
            lr = light.rates(lr)
        skipped = step.skipped() if step.found_inf else False
        if step.on_device or self.pending:  # (behind a row still on its way: in step order, never waited for)
            row = PendingRow(step.step, False, None, 0, n_params=len(self.params), norms=False, lr=lr, skipped=skipped)
            row.loss_slots = row.nums.extend(step.losses)
            row.nums.launch()
            self.pending.append(row)
            self.resolve_ready()
        else:
            losses = step.losses
            hit = self.triggers.loss_trigger(losses) if losses else None
            self._join(step.step, False, row_without_norms(step.step, losses, lr, len(self.params), skipped), hit)
            self._maybe_flush()
        return True

    def drain(self) -> None:
        """The light rows kept join the history in step order, their losses read by the loss rules: those under
        their rule's quiet bound only join its window (NOTE [Light rows] in light_rows.py)."""
        t0 = time.perf_counter()
        light = self.light
        batches, loud, samples, quiet = light.take(blank_row(len(self.params)))
        n = sum(map(len, batches))
        if n:
            last = batches[-1].pop() if loud else None
            self.triggers.add_quiet(quiet)
            self.kept.add_batches(batches)  # (`_take_plain` of each row)
            if last is not None:  # (its loss may set a rule off: read as `take_light` reads one)
                hit = self.triggers.loss_trigger(last["losses"])
                if hit is None:
                    self._take_plain(last)
                else:
                    self._join(last["step"], False, last, hit)
        light.bound(self.triggers.loss_rules)
        light.since = time.monotonic()
        self._maybe_flush()
        light.joined(time.perf_counter() - t0, n)
        self.sampler.took_light(samples, light.per_row)  # (NOTE [Native light steps] in light_native.py)

    def _take_plain(self, row: WireHistoryRow) -> None:
        """`_take` for a row of an untraced step without norms whose losses the loss rules have read already
        (`plain_row`): nothing in it can set off a trigger (a step GradScaler skipped is never plain)."""
        self.kept.add(row)

    def _take(self, step: int, traced: bool, checked: int, wire: WireHistoryRow, losses: list[float | None]) -> None:
        """Step `step`'s row joins the history (its first `checked` losses read by the loss rules already); the
        triggers it sets off are noted (for the step's own trace) or wait for the next step (NOTE [Trigger rules])."""
        hit = self.triggers.loss_trigger(losses[checked:], checked) if len(losses) > checked else None
        self._join(step, traced, wire, hit)

    def _join(self, step: int, traced: bool, wire: WireHistoryRow, hit: tuple[str, dict[str, Any]] | None) -> None:
        """`_take` of step `step`'s row, its losses read by the loss rules (`hit`: what they set off)."""
        trig, norms = self.triggers, wire["param_norms"]
        found: list[tuple[str, dict[str, Any]]] = []  # for this step's trace, when it has one
        later: list[tuple[str, dict[str, Any]]] = []  # for the next step's
        if hit is not None:  # read after the step (not on the CPU): the next step is traced
            later.append((hit[0], {**hit[1], "step": step}))
        behind = self.trace_of.get(step)
        if traced and behind is not None and behind[1].setdefault("step", step) == step:
            self.trace_of.pop(step)  # a loss trigger traced this very backward
            found.append(behind)
        g = wire["grad_norm"]
        if g is not None and finite(g):
            spike = trig.grad_rule.take(float(g))
            if spike is not None and trig.on("grad_spike"):
                later.append(("grad_spike", {"grad_norm": g, "median": spike[0], "threshold": spike[1],
                                             "step": step}))
        if wire["skipped"] and trig.on("amp_skipped"):
            bad = [self.names[i] for i, v in enumerate(norms)
                   if v is not None and not finite(v) and i < len(self.names)]
            later.append(("amp_skipped", {"step": step, "scale": wire["scale"], "params": bad}))
        for kind, d in found + later:
            if kind in ("loss_spike", "grad_spike"):
                d["layer"] = rising_layer(self.window, step, norms)
        if wire["norms"]:  # (a row without norms says nothing of which layer rose: NOTE [Sampled norms])
            self.window.append((step, list(norms)))
        if traced:
            self.found[step] = found + later
        elif later and trig.pending is None:
            trig.pending = (later[0][0], step, later[0][1])
            self.sync_fast()  # (the next step is traced)
        self.kept.add(wire)

    def history(self) -> list[dict[str, Any]]:
        """The rows kept, as `TraceStore.history` gives them (each parameter's norm by name)."""
        if self.light.waiting():
            self.drain()
        return [row_as_dict(r, self.names) for r in self.kept.rows()]

    def flush(self, force: bool = False) -> None:
        """Write the rows not yet written to every sink that takes history (`write_history`)."""
        if self.light.waiting():
            self.drain()  # (which flushes again: nothing is left then)
        if not self.kept.n_unsent:
            return
        self._last_flush = time.monotonic()
        writers = [(type(sink).__name__, w) for sink in self.tracer.sinks
                   if (w := getattr(sink, "write_history", None)) is not None]
        if not writers:  # (the memory sink: `Tracer.history` reads the monitor's own rows)
            self.kept.drop_unsent()
            return
        rows = self.kept.take_unsent()
        n = len(self.names)
        for r in rows:
            if len(r["param_norms"]) < n:
                r["param_norms"] = r["param_norms"] + [None] * (n - len(r["param_norms"]))
        batch = history_to_wire(self.tracer.run, _rank(), list(self.names), rows)
        for name, write in writers:
            try:
                write(batch)
            except Exception as exc:  # a sink must never break training
                log.warning("gradscape: sink %s could not take the history: %s", name, exc)

    def close(self) -> None:
        self._hold.release()
        self.resolve_ready(force=True)
        self.flush(force=True)


def _plain(v: Any) -> Any:
    """A number for `st.meta` (JSON has no NaN or infinity: those are written as text)."""
    return repr(v) if isinstance(v, float) and not finite(v) else v


def _rank() -> int | None:

    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None
