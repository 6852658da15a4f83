"""What an optimizer stepped with, as the monitor reads it in the step's post-hook: the gradients, their norms
before clipping (from the snapshots) and after, and on a traced step their summaries.

NOTE [Stepped norms read from the summaries]
    On a step without a trace the norms of what an optimizer stepped with are one fused call
    (`torch._foreach_norm`) and `vector_norm` of their stack, as for the norms before clipping (NOTE [Norms
    before and after clipping] in capture.py). On a traced step the same gradients are summarised at that
    moment (NOTE [Parameter gradients] in tracer/record/params.py), and where every summary is the summary
    kernel's, its sum of squares (accumulated in float64) gives each norm: one extension call
    (`row_norms`) in place of three torch calls, which run several times slower between the loop's calls
    than alone (docs/costs.md has what this saved on small programs' traced steps). Their total is
    `sqrt(fsum(norm²))`. These are `OptimizerStep.grad_norm` and the row's `grad_norm_clipped` on a traced step:
    a float64 sum where the fused call sums in the gradient's precision, so the two agree to about 1e-7
    (float32), not bit for bit. A NaN in a gradient makes its norm NaN, an Inf (and no NaN) inf, as torch's
    norm does (the kernel's sums leave them out). The norms before clipping stay torch's on every step:
    `grad_norm_before_clip` equals what `clip_grad_norm_` returned. Where a summary is Python's (a CUDA
    gradient, a sparse one, every summary of a step the Python recorder records), the step takes the fused
    call: the two recorders' `grad_norm` of one step agree to about 1e-7 (tests/test_call_thumbs.py).
"""

from __future__ import annotations

from typing import Any

import torch

from gradscape.tracer.monitor.grad_norms import Norms, gather, joined, norms_of, quick_norms, total_of
from gradscape.tracer.record.native import extension
from gradscape.tracer.summary.stats import grad_off


def stepped_grads(mon: Any, opt: Any) -> tuple[list[int], list[torch.Tensor]]:
    """The indices (the monitor's) and gradients of the optimizer's parameters that have one, in its order: one
    extension call where every parameter is a plain tensor the monitor has indexed (NOTE [Parameter rules in one
    call] in tracer/record/csrc/param_grads.h)."""
    index = mon._index
    ext = extension()
    read = None if ext is None else ext.stepped(opt.param_groups, index)
    if read is not None:
        return read  # type: ignore[no-any-return]
    idx: list[int] = []
    grads: list[torch.Tensor] = []
    for gi, group in enumerate(opt.param_groups):
        for k, p in enumerate(group["params"]):
            g = p.grad
            if g is not None:
                i = index.get(id(p))
                idx.append(mon.index_of(p, opt, gi, k) if i is None else i)
                grads.append(g)
    return idx, grads


def norms_stepped(cap: Any, rec: Any, opt: Any) -> None:
    """`rec` (an `OptRecord`) filled with what `opt` stepped with: its parameters, their norms before clipping
    (`before`, `total_before`), the total after (`total_after`), and on a traced step their summaries."""
    rec.idx, grads = stepped_grads(cap.mon, opt)
    if not grads:
        return
    after: Norms | None = None
    with grad_off():
        if cap.traced is not None:  # the gradients it stepped with, summarised (NOTE [Parameter gradients])
            rec.summaries = cap._summarise(rec.idx, grads)
            cap.params_stepped.update(rec.summaries)
            kernel = _kernel_norms(cap, list(map(rec.summaries.__getitem__, map(cap.mon.names.__getitem__, rec.idx))))
            if kernel is not None:
                rec.total_after = total_of(kernel)
        if rec.total_after is None:  # (no exact equality promised: NOTE [Native norms] in grad_norms.py)
            after = quick_norms(grads)
            rec.total_after = total_of(after)
        rec.before = before_of(cap, rec.idx, lambda: after if after is not None else norms_of(grads))
    rec.total_before = total_of(rec.before)


def _kernel_norms(cap: Any, summaries: list[Any]) -> list[float] | None:
    """Each summary's norm from the kernel's statistics, or None unless every one is a row of the kernel's."""
    native = cap.traced.rec.native
    if native is None:
        return None
    try:
        norms = native.row_norms(summaries)
    except TypeError:  # (a `TensorTrace`: Python's summary)
        return None
    return None if None in norms else norms


def before_of(cap: Any, idx: list[int], fallback: Any) -> Norms:
    """The optimizer's per-parameter norms as the backward left them, from the snapshots (a tensor, or floats where
    one was read from summaries: NOTE [Norms after a backward from the arrivals] in arrival_norms.py); `fallback()`
    gives the norms of its gradients now, for a parameter no snapshot holds."""
    snaps = cap.snaps
    if not snaps:
        return fallback()
    run = _run_in(snaps[-1], idx)  # the latest snapshot is every one of its parameters' last
    if run is not None:
        return run
    before = before_map(snaps)
    held = [before.get(i) for i in idx]
    found = [snap for snap in held if snap is not None]
    if found and len(found) == len(held):
        vec = found[0][0]
        if all(snap[0] is vec for snap in found):
            # one snapshot holds them all: one gather, not one op per parameter
            return gather(vec, [snap[1] for snap in found])
    if len(found) == len(held):
        return joined([snap[0][snap[1]] for snap in found])
    now = fallback()
    return joined([now[k] if snap is None else snap[0][snap[1]] for k, snap in enumerate(held)])


def before_map(snaps: list[tuple[list[int], Norms]]) -> dict[int, tuple[Norms, int]]:
    """Parameter index → (the norm vector of its last snapshot in `snaps`, its position there)."""
    out: dict[int, tuple[Norms, int]] = {}
    for idx, vec in snaps:
        for k, i in enumerate(idx):
            out[i] = (vec, k)
    return out


def _run_in(snap: tuple[list[int], Norms], idx: list[int]) -> Norms | None:
    """The norms of parameters `idx` where snapshot `snap` holds them as a run, in order (an optimizer's parameters
    after a backward that reached them, with or without others): the snapshot's vector or a slice of it; else None."""
    have, vec = snap
    if not idx:
        return None
    if have == idx:
        return vec
    try:
        k = have.index(idx[0])
    except ValueError:
        return None
    return vec[k:k + len(idx)] if have[k:k + len(idx)] == idx else None
