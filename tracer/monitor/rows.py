"""A step's history row, from what its `StepCapture` saw: tensors gathered in `LazyNumbers` at the end
of the block, turned into plain numbers once they can be read (NOTE [No sync on CUDA] in `lazy.py`)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter, mul
from typing import Any

import torch

from gradscape.tracer._model import OptimizerStep
from gradscape.tracer.monitor.capture import StepCapture
from gradscape.tracer.monitor.grad_norms import Norms, gather
from gradscape.tracer.monitor.lazy import LazyNumbers
from gradscape.tracer.monitor.stepped import before_map
from gradscape.tracer.wire.history import WireHistoryRow


@dataclass
class PendingRow:
    """A step's row whose numbers may still be on the device."""

    step: int
    traced: bool
    trigger: str | None
    checked: int  # losses already given to the loss rules (read on the CPU during the block)
    nums: LazyNumbers = field(default_factory=LazyNumbers)
    loss_slots: Sequence[int] = ()
    norm_slots: list[tuple[list[int], int]] = field(default_factory=list)  # (param indices, slot of their vector)
    # (the record, its lr slots, its norm and scale slots)
    opt_slots: list[tuple[OptimizerStep, Sequence[int], dict[str, int]]] = field(default_factory=list)
    clip_slots: list[tuple[list[int], int]] = field(default_factory=list)  # norms after each clip: (indices, slot)
    lr: dict[str, list[Any]] = field(default_factory=dict)
    skipped: bool = False
    n_params: int = 0
    norms: bool = True  # the step took the gradient norms (NOTE [Sampled norms])


def pending_row(cap: StepCapture, n_params: int, names: list[str]) -> PendingRow:
    """Gather what the block saw; nothing is read here."""
    tr = cap.traced
    row = PendingRow(cap.step, tr is not None, None if tr is None else tr.st.trigger, cap.checked, n_params=n_params,
                     norms=cap.norms)
    nums = row.nums
    row.loss_slots = nums.extend(cap.losses)
    row.norm_slots = [(idx, nums.add(vec)) for idx, vec in _norm_vectors(cap)] if cap.norms else []
    row.clip_slots = [(idx, nums.add(vec)) for idx, vec in cap.clips]
    for r in cap.records:
        slots = {"before": nums.add(r.total_before)}
        if r.stepped:
            slots["after"] = nums.add(r.total_after)
        if r.inv_scale is not None:
            slots["inv"] = nums.add(r.inv_scale)
        row.opt_slots.append((_optimizer_step(r, names), nums.extend(r.lr), slots))
        row.skipped = row.skipped or not r.stepped
    nums.launch()
    return row


class OnDevice(Exception):
    """A number of a step's row is on a device (`host_row`: the row waits in `LazyNumbers`)."""


def _host(x: Any) -> Any:
    """`x` read now, as `LazyNumbers.launch` reads it on the CPU: a tensor by `tolist`, anything else as it is."""
    if isinstance(x, torch.Tensor):
        if not x.is_cpu:
            raise OnDevice
        return x.tolist()
    return x


def host_row(cap: StepCapture, n_params: int,
             names: list[str]) -> tuple[WireHistoryRow, list[OptimizerStep], list[float | None]] | None:
    """`resolve(pending_row(cap, n_params, names))` for a step whose numbers are all on the host (a traced or full
    step on the CPU), read at once with no slots; None where one is on a device."""
    try:
        losses = list(map(_host, cap.losses))
        vecs = [(idx, _host(vec)) for idx, vec in _norm_vectors(cap)] if cap.norms else []
        clips = [(idx, _host(vec)) for idx, vec in cap.clips]
        opts = [(_optimizer_step(r, names), list(map(_host, r.lr)), _host(r.total_before),
                 _host(r.total_after) if r.stepped else None, _host(r.inv_scale)) for r in cap.records]
    except OnDevice:
        return None
    tr = cap.traced
    head = (cap.step, tr is not None, None if tr is None else tr.st.trigger, cap.norms,
            any(o.skipped for o, *_ in opts))
    return _wire(head, n_params, {}, losses, vecs, opts, clips)


def _optimizer_step(r: Any, names: list[str]) -> OptimizerStep:
    """Record `r`'s `OptimizerStep`, before its numbers (`_wire`)."""
    return OptimizerStep(optimizer=r.name, params=list(map(names.__getitem__, r.idx)), skipped=not r.stepped)


def plain_row(cap: StepCapture, n_params: int) -> WireHistoryRow | None:
    """The row of an untraced step without norms whose every number is on the host already (its losses read
    on the CPU, no GradScaler, every optimizer stepped): made at once, with no `LazyNumbers` (a third of the
    monitor's own time on a 0.1 ms step). None when it does not qualify."""
    if cap.norms or cap.traced is not None or cap.checked != len(cap.losses):
        return None
    lr: dict[str, list[float]] = {}
    for r in cap.records:
        if not r.stepped or r.inv_scale is not None or r.found_inf:
            return None
        values = r.lr
        for v in values:
            if isinstance(v, torch.Tensor) and not v.is_cpu:  # (a learning rate on a device: read with a wait)
                return None
        lr[r.name] = [float(v) for v in values if v is not None]
    return row_without_norms(cap.step, list(cap.loss_values), lr, n_params)


def row_without_norms(step: int, losses: list[float | None], lr: dict[str, list[float]], n_params: int,
                      skipped: bool = False) -> WireHistoryRow:
    """The row of an untraced step without norms whose numbers are all on the host (`plain_row`, a light step's:
    NOTE [Light steps] in light.py)."""
    row = filled(blank_row(n_params), step, losses, lr)
    row["skipped"] = skipped
    return row


def blank_row(n_params: int) -> WireHistoryRow:
    """A row of an untraced step without norms, none skipped, before its step, losses and learning rates (`filled`;
    a batch of light rows is made of it when read: NOTE [Kept rows] in kept_rows.py). Its rows
    share one `param_norms`, which no reader of a row changes (`Monitor.flush` pads it with a new list)."""
    return {"step": 0, "loss": None, "losses": [], "grad_norm": None, "grad_norm_clipped": None,
            "param_norms": [None] * n_params, "lr": {}, "scale": None, "skipped": False, "traced": False,
            "trigger": None, "norms": False}


def filled(blank: WireHistoryRow, step: int, losses: list[float | None], lr: dict[str, list[float]]) -> WireHistoryRow:
    """A copy of `blank` (`blank_row`) with step `step`'s losses (`loss`: the first that is not None) and rates."""
    row = blank.copy()
    row["step"] = step
    row["loss"] = next((v for v in losses if v is not None), None)
    row["losses"] = losses
    row["lr"] = lr
    return row


def _norm_vectors(cap: StepCapture) -> list[tuple[list[int], Norms]]:
    """Each parameter's norm before clipping, as (param indices, their norms): as its optimizer saw it, else
    the last snapshot."""
    snaps = cap.snaps
    if len(snaps) == 1 and all(r.before is None or r.before is snaps[0][1] for r in cap.records):
        return snaps  # the usual step: one backward's snapshot, which every optimizer stepped with
    stepped = [(r.idx, r.before) for r in cap.records if r.before is not None]
    each = set(chain.from_iterable(map(itemgetter(0), stepped)))
    if sum(map(len, map(itemgetter(0), stepped))) == len(each) and each.issuperset(
            chain.from_iterable(map(itemgetter(0), snaps))):
        return stepped  # (a GAN's: every parameter a snapshot holds stepped once, by one optimizer)
    per = before_map(cap.snaps)
    for r in cap.records:
        if r.before is not None:
            for k, i in enumerate(r.idx):
                per[i] = (r.before, k)
    groups: dict[int, tuple[Norms, list[int], list[int]]] = {}
    for i, (vec, k) in per.items():
        g = groups.setdefault(id(vec), (vec, [], []))
        g[1].append(i)
        g[2].append(k)
    return [(idx, gather(vec, pos)) for vec, idx, pos in groups.values()]


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def resolve(row: PendingRow) -> tuple[WireHistoryRow, list[OptimizerStep], list[float | None]]:
    """(the wire row, the optimizer steps with their numbers, every loss). Waits if not ready."""
    at = row.nums.values().__getitem__
    opts = [(o, list(map(at, lr_slots)), at(slots["before"]), at(slots["after"]) if "after" in slots else None,
             at(slots["inv"]) if "inv" in slots else None) for o, lr_slots, slots in row.opt_slots]
    return _wire((row.step, row.traced, row.trigger, row.norms, row.skipped), row.n_params, row.lr,
                 list(map(at, row.loss_slots)), [(idx, at(s)) for idx, s in row.norm_slots], opts,
                 [(idx, at(s)) for idx, s in row.clip_slots])


# (the record, its learning rates, its totals before and after clipping, GradScaler's inverse scale), each read
_Opt = tuple[OptimizerStep, list[Any], Any, Any, Any]


def _wire(head: tuple[int, bool, str | None, bool, bool], n_params: int, lr0: dict[str, list[Any]],
          raw_losses: list[Any], vecs: list[tuple[list[int], Any]], opts: list[_Opt],
          clips: list[tuple[list[int], Any]]) -> tuple[WireHistoryRow, list[OptimizerStep], list[float | None]]:
    """The row from its numbers, read (`resolve`, `host_row`); `head`: (step, traced, trigger, norms, skipped)."""
    step, traced, trigger, with_norms, skipped = head
    losses = [None if v is None else float(v) for v in raw_losses]
    norms: list[float | None] = [None] * n_params
    for idx, vec in vecs:
        if idx and max(idx) < len(norms):  # (`map` and `deque`: no Python code a parameter)
            deque(map(norms.__setitem__, idx, map(float, vec)), maxlen=0)
            continue
        for i, v in zip(idx, vec):
            if i < len(norms):
                norms[i] = float(v)
    steps: list[OptimizerStep] = []
    lr: dict[str, list[float]] = dict(lr0)  # (a light step's, read as it ended: NOTE [Light steps])
    clipped_sq, any_step, inv_all = 0.0, False, None
    for o, rates, before, after, inv in opts:
        o.grad_norm_before_clip = _f(before)
        if not o.skipped:
            o.grad_norm = _f(after)
            clipped_sq += (o.grad_norm or 0.0) ** 2
            any_step = True
        if inv is not None:
            inv_all = float(inv)
            o.scale = None if not inv_all else 1.0 / inv_all
        o.lr = [float(v) for v in rates if v is not None]
        lr[o.optimizer] = list(o.lr)
        steps.append(o)
    if not any_step and clips:  # clipped, no optimizer stepped (an update by hand): the last clip's
        clipped = {i: float(v) for idx, vec in clips for i, v in zip(idx, vec)}
        clipped_sq, any_step = sum(v * v for v in clipped.values()), True
    present = [v for v in norms if v is not None] if None in norms else norms
    total = math.sqrt(sum(map(mul, present, present))) if present else None
    wire: WireHistoryRow = {
        "step": step, "loss": next((v for v in losses if v is not None), None), "losses": losses,
        "grad_norm": total, "grad_norm_clipped": math.sqrt(clipped_sq) if any_step and with_norms else None,
        "param_norms": norms, "lr": lr, "scale": None if not inv_all else 1.0 / inv_all,
        "skipped": skipped, "traced": traced, "trigger": trigger, "norms": with_norms}
    return wire, steps, losses
