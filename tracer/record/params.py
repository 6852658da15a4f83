"""The parameters' gradients of one traced step: `st.params`.

NOTE [Parameter gradients]
    `st.params[name]` is the gradient the optimizer will see: the parameter's `.grad` when the step's
    last backward returned (so accumulated over micro-batches, and all-reduced under
    DistributedDataParallel, whose reducer writes `.grad` before the backward returns), or what
    `torch.autograd.grad` returned for it. `.grad` is read when each pass ends, for the parameters a
    gradient arrived at in that pass (`ParamGradients.arrived`, noted by the AccumulateGrad pre-hooks);
    clipping or an optimizer step later in the block changes nothing here (NOTE [Settled at the step's end]).
    What arrived at each
    AccumulateGrad node in each pass stays in that node's runs. When `.grad` is the very tensor that
    arrived (the usual single backward after `zero_grad()`), the arrival's summary is taken as it is:
    no second pass over the gradient.

    With the monitor on, what each optimizer then stepped with replaces those entries, and for a
    parameter no optimizer stepped with, its gradient as a `clip_grad_norm_` / `clip_grad_value_` of the
    block left it (an update written by hand; NOTE [Clipping seen]) (tracer/monitor/capture.py),
    summarised in one call into the native recorder where it records the step. An arrival so replaced is
    not made into a `TensorTrace` at all (`replaced`): the problem finder, which judges the gradients as
    the backward left them (before clipping), gets each one's norm and whether it counted a NaN or an Inf
    from the extension (`unmade`).

NOTE [Settled at the step's end]
    A `.grad` that is not the arrival itself (micro-batches: the sum of several passes' arrivals) is not
    summarised when its pass ends but kept, with its version counter, until the step ends (`settle`): a later
    pass that reaches the parameter replaces it, so a step of k micro-batches summarises each parameter's
    gradient once, not k times (`bench/loop_costs.py`, the gpt_micro rows), all of them in one call into the
    native recorder where it records the step (rows of its tensor table: `TensorTrace`s made by `resolve`, but
    for a gradient an optimizer then stepped with, whose entry the monitor replaces: its norm only, as for an
    arrival). Holding the tensor keeps its values when `zero_grad()` lets go of it; what changes it in place is
    seen first: a clip, GradScaler's unscale and an optimizer step settle the pending gradients before they run
    (tracer/monitor/capture.py).
    A gradient changed in place by anything else (its version counter moved) is summarised as the step ends,
    and `st.meta["notes"]` says so; one changed through `.data` (which no version counter sees) is summarised as
    changed, without a note. The monitor's norms are still taken as each backward returns (`grad_norm` is as the
    backward left the gradients, whatever the loop does to them after: tests/test_optimizer_steps.py).

NOTE [Summarised once]
    With the monitor on, an optimizer's step (and a clip) summarises the gradients it used (NOTE [Parameter
    gradients]). Where `settle` summarised the very same tensors just before, at that call's pre-hook, and
    nothing changed them since (their version counters did not move), the two summaries are of the same values:
    `made` hands over `settle`'s (the same row of the native recorder's tensor table, the same `TensorTrace`),
    so the kernel does not run twice over each accumulated gradient of a step of micro-batches. A clip changes
    the gradients in place and moves their versions: they are summarised again, once, and the optimizer's step
    after it is handed the clip's summaries (`note_made`, from `StepRecorder.summarise_used`). GradScaler's
    unscale (and a fused optimizer's, under `grad_scale`) changes them where no version counter sees it, so when
    one is seen nothing summarised before is handed over (`forget_made`, from tracer/monitor/capture.py). What
    is kept is a weak reference and the version, so no gradient lives longer for it.
    An arrival that `after_pass` took as it was is not handed over: between the backward and the optimizer's
    step the loop may change `.grad` through `.data` (`p.grad.data.clamp_(-1, 1)`), which moves no version
    counter; inside the optimizer's own pre- and post-hooks, where `settle` runs, only the optimizer does.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, MutableMapping, Sequence
from itertools import compress
from operator import attrgetter, itemgetter, ne
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer._model import TensorTrace
from gradscape.tracer.record.lazy_traces import TableTraces
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.record.native import extension
from gradscape.tracer.record.native_step import Arrivals
from gradscape.tracer.summary.summariser import Summariser

# what identifies a gradient that arrived at a parameter (NOTE [Dedupe] in tracer/record/node_hooks.py)
Arrival = tuple[TensorTrace | None, tuple[Any, ...] | None]


def _dtensor_type() -> Any:
    """torch.distributed's DTensor class, or None where torch.distributed is not built."""
    try:
        from torch.distributed.tensor import DTensor
    except Exception:
        return None
    return DTensor


def _dist_initialized() -> bool:
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized())


def _arrival(pos: int, g: torch.Tensor, version: int) -> tuple[int, weakref.ref[torch.Tensor], int]:
    """`st.params[name]` to be: the summary of what arrived in run `pos` of the native recorder, which is `.grad`
    (`g`, weakly held) as of its `version` when the pass ended. A tuple, as the extension makes them (NOTE [Parameter
    rules in one call] in csrc/param_grads.h): the only tuples `traces` holds."""
    return (pos, weakref.ref(g), version)


def _version_of(g: torch.Tensor) -> int:
    """`g`'s version counter (-1 for a tensor without one: an inference tensor set as `.grad` by hand)."""
    try:
        return int(g._version)
    except RuntimeError:
        return -1


def _versions(grads: list[torch.Tensor]) -> list[int]:
    """Each of `grads`' version counter (-1 for a tensor without one)."""
    try:
        return list(map(_VERSION, grads))
    except RuntimeError:  # (an inference tensor among them)
        return [_version_of(g) for g in grads]


_VERSION = attrgetter("_version")


def in_order(entries: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
    """`entries` (`st.params` to be) listed in the order of `names` (the model's parameters), a name not among them
    after those, as listed."""
    keys = list(filter(entries.__contains__, names))  # (`filter` and `map`: no Python code a parameter)
    out = dict(zip(keys, map(entries.__getitem__, keys)))
    if len(out) != len(entries):
        out.update(entries)
    return out


_PENDING = None  # `traces`' value for a gradient kept until `settle` (its place in the order, held)


class ParamGradients:
    """`st.params` of one step (NOTE [Parameter gradients]): `traces`, by parameter name."""

    def __init__(self, model: ModelIndex, summariser: Summariser) -> None:
        self.model, self.summ = model, summariser
        # TensorTrace; until `resolve`, an arrival (`_arrival`) or a row of the tensor table `settle` made (an int)
        self.traces: dict[str, Any] = {}
        # the native recorder's step: its tensor table, once `resolve` left rows of it in `traces` (NOTE [Traces
        # made when read] in lazy_traces.py)
        self.table: Any = None
        # parameter → (summary, identity) of what last arrived at it in the running pass (`note_arrival`)
        self.arrived: dict[str, Arrival] = {}
        # name → (`.grad` as a pass left it, its version): summarised by `settle` (NOTE [Settled at the step's end])
        self.pending: dict[str, tuple[torch.Tensor, int]] = {}
        # the parameters whose `st.params` entry the monitor replaces with what their optimizer stepped with
        # (tracer/monitor/capture.py): an arrival of theirs is not made a `TensorTrace` (`resolve`)
        self.replaced: Collection[str] = ()
        # those arrivals' (norm, counted a NaN or an Inf), for the problem finder, which reads the gradients
        # as the backward left them (tracer/record/debug/step_checks.py)
        self.unmade: dict[str, tuple[float, bool]] = {}
        # the same of the rows `resolve` left in `traces` (made `TensorTrace`s only when read)
        self.held: dict[str, tuple[float, bool]] = {}
        # name → (a weak reference to a gradient summarised at `settle`, a clip or an optimizer step, its version
        # then, that summary: a row of the native recorder's tensor table or a `TensorTrace`): what `made` hands a
        # clip or an optimizer step instead of a second summary (NOTE [Summarised once])
        self.made_of: dict[str, tuple[weakref.ref[torch.Tensor], int, Any]] = {}
        self.distributed = _dist_initialized()
        # FSDP2 (`fully_shard`): the parameters are DTensor shards (NOTE [Unsharded parameters]); the
        # DTensor class then, else None
        dtensor = _dtensor_type() if self.distributed else None
        self.dtensor = dtensor if dtensor is not None and any(
            isinstance(p, dtensor) for p in model.param_by_name.values()) else None

    def note_arrival(self, name: str, g: torch.Tensor, tr: TensorTrace | None) -> None:
        """A gradient arrived at a parameter's AccumulateGrad node: its `.grad` is read when the pass
        ends (`after_pass`). The arrival's identity is kept, not the tensor (holding it would stop
        AccumulateGrad from taking it over as `.grad`)."""
        key = (g.data_ptr(), g.shape, g.stride(), g.dtype) if g.layout == torch.strided else None
        self.arrived[name] = (tr, key)

    def after_pass(self, api: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
                   arrivals: Arrivals | None = None) -> None:
        """Read the gradients a backward pass left: see NOTE [Parameter gradients]. `arrivals`: what the native
        recorder read of the arrivals, when it recorded the pass (`NativeStep.end_pass`)."""
        if api == "autograd.grad":
            self._returned(args, kwargs, result)
            return
        arrived, self.arrived = self.arrived, {}
        dtensor, pending = self.dtensor, self.pending
        if arrivals is not None and not arrived and dtensor is None:
            # one extension call: NOTE [Parameter rules in one call] in csrc/param_grads.h
            extension().after_call(arrivals[0], arrivals[1], self.traces, pending, not self.distributed)
            return
        by_name = {} if arrivals is None else {arrivals[1][e[0]]: e[1:] for e in arrivals[0] if e[0] in arrivals[1]}
        for name in list(arrived) + [n for n in by_name if n not in arrived]:
            p = self.model.param_by_name.get(name)
            g = None if p is None else p.grad
            if g is None or (dtensor is not None and isinstance(g, dtensor)):
                continue  # a shard (FSDP2): `_sharded` reads it without touching the other ranks
            held = pending.get(name)
            if held is not None and held[0] is g and name not in arrived:
                # the very `.grad` a pass before left, added to in place (gradient accumulation): still summarised
                # at the step's end, as of this pass's version
                pending[name] = (g, _version_of(g))
                continue
            same = not self.distributed and _compat.post_accumulate_grad_hooks(p) is None
            pending.pop(name, None)
            if name in arrived:
                tr, key = arrived[name]
                if (same and tr is not None and key is not None and g.layout == torch.strided
                        and key == (g.data_ptr(), g.shape, g.stride(), g.dtype)):
                    self.traces[name] = tr
                    continue
            elif same and (a := by_name.get(name)) is not None and a[2] and a[1] is g:
                self.traces[name] = _arrival(a[0], g, a[3])  # its summary, once the step's tables are made (`resolve`)
                continue
            self.traces[name] = _PENDING
            pending[name] = (g, _version_of(g))
        if dtensor is not None:
            self._sharded(dtensor)

    def settle(self, native: Any = None) -> list[str]:
        """Summarise the gradients kept since their pass ended (NOTE [Settled at the step's end]): in one call
        into the native recorder's summaries where it records the step (`native`, its `NativeStep`), else one
        by one. Returns the names of those changed in place since."""
        pending, self.pending = self.pending, {}
        if not pending:
            return []
        grads = list(map(itemgetter(0), pending.values()))  # (`map`: no Python code a gradient)
        moved = list(map(ne, _versions(grads), map(itemgetter(1), pending.values())))
        changed = list(compress(pending, moved)) if True in moved else []
        rows = native.summarise(grads) if native is not None else [-1] * len(pending)
        if min(rows) >= 0:  # (every one a row of the native recorder's tensor table)
            self.traces.update(zip(pending, rows))
            made = rows
        else:
            made = [row if row >= 0 else self.summ.summarise(g) for g, row in zip(grads, rows)]
            self.traces.update(zip(pending, made))
        self.note_made(list(pending), grads, made)
        return changed

    def note_made(self, names: Sequence[str], grads: Sequence[torch.Tensor], summaries: Sequence[Any]) -> None:
        """`summaries[k]` (a row of the native recorder's tensor table or a `TensorTrace`, at the first thumbnail size)
        is of `grads[k]`, parameter `names[k]`'s gradient, as it is now: `made` may hand it over (NOTE [Summarised
        once]). Each entry: (a weak reference to the gradient, its version, the summary)."""
        ext = extension()
        if ext is not None:  # NOTE [Parameter rules in one call] in csrc/param_grads.h
            ext.note_made(self.made_of, names, grads, summaries)
            return
        for name, g, summary in zip(names, grads, summaries):
            self.made_of[name] = (weakref.ref(g), _version_of(g), summary)

    def forget_made(self) -> None:
        """Gradients were changed in place where no version counter sees it (GradScaler's unscale): `made` hands
        nothing summarised before (NOTE [Summarised once])."""
        self.made_of = {}

    def made(self, names: list[str], grads: list[torch.Tensor]) -> tuple[dict[str, Any], Sequence[str],
                                                                          Sequence[torch.Tensor]]:
        """For each of `grads` (the `.grad` of parameter `names[k]`), the summary `settle`, a clip or an optimizer
        step made of that very tensor, unchanged since: a row of the native recorder's tensor table or a
        `TensorTrace` (NOTE [Summarised once]). Returns (name → that summary, where there is one, else None; the names
        and gradients of the others, to be summarised)."""
        ext = extension()
        if ext is not None:  # NOTE [Parameter rules in one call] in csrc/param_grads.h
            made = ext.made(list(map(self.made_of.get, names)), grads)
        else:
            made = []
            for name, g in zip(names, grads):
                held = self.made_of.get(name)
                ok = held is not None and held[0]() is g and held[1] >= 0 and _version_of(g) == held[1]
                made.append(held[2] if ok else None)  # type: ignore[index]
        if made.count(None) == len(made):
            return {}, names, grads
        todo = [(name, g) for name, g, m in zip(names, grads, made) if m is None]
        return dict(zip(names, made)), [name for name, _ in todo], [g for _, g in todo]  # (in `names`' order)

    def arrivals_unchanged(self, names: list[str], grads: list[torch.Tensor]) -> list[int] | None:
        """The native recorder's run of the arrival each of `grads` (parameter `names[k]`'s `.grad`) is, unchanged
        since the pass it arrived in ended (the same tensor, the same version); None unless every one is (the
        monitor's norms after a backward: NOTE [Norms after a backward from the arrivals] in
        tracer/monitor/arrival_norms.py). Read by the extension, which the native recorder's step has."""
        return extension().unchanged_runs(list(map(self.traces.get, names)), grads)  # type: ignore[no-any-return]

    def resolve(self, native: Any) -> None:
        """The summaries of the arrivals `after_pass` took as they were and of the gradients `settle` summarised
        (native recorder), once the step's tables are made; a replaced one's numbers only (`unmade`)."""
        self.traces, _rows = native.resolve_params(self.traces, self.replaced, self.unmade, self.held)
        self.table = native.tables.tensors  # the rows are made `TensorTrace`s when read (`in_model_order`)

    def in_model_order(self) -> MutableMapping[str, Any]:
        """`st.params`: the parameters in the model's order (`named_parameters`), whichever recorder listed them and
        whenever a gradient first arrived."""
        ordered = in_order(self.traces, self.model.param_by_name)
        return ordered if self.table is None else TableTraces(self.table, ordered)

    def _returned(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        """`torch.autograd.grad`: what it returned for each parameter among its inputs."""
        if result is None:
            return
        inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
        if isinstance(inputs, (torch.Tensor, torch.autograd.graph.GradientEdge)):
            inputs = (inputs,)
        for t, g in zip(inputs or (), result):
            name = self.model.name_of(t) if isinstance(t, torch.Tensor) else None
            if name is not None and isinstance(g, torch.Tensor):
                self.pending.pop(name, None)
                self.traces[name] = self.summ.summarise(g)

    def _sharded(self, dtensor: Any) -> None:
        """FSDP2 (`fully_shard`): the parameters are DTensor shards, and gradients arrive at the unsharded
        copies it makes for each forward (named after their parameter: NOTE [Unsharded parameters]).
        After the backward, a parameter's `.grad` is this rank's shard of the reduced gradient: what its
        optimizer steps with, kept as `st.params[name]` (the local shard, in the shard's own shape; an
        op on the DTensor itself could start a collective)."""
        for name, p in self.model.param_by_name.items():
            g = p.grad
            if isinstance(g, dtensor):
                self.traces[name] = self.summ.summarise(g.to_local())
