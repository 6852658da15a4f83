"""The norms after a backward read from what the native recorder summarised as the gradients arrived.

NOTE [Norms after a backward from the arrivals]
    After each backward the monitor takes the norm of every parameter's gradient (NOTE [Norms before and after
    clipping] in capture.py). On a traced step the native recorder has already summarised what arrived at each
    parameter's AccumulateGrad node as the backward ran, and the summary kernel keeps each one's sum of squares in
    float64. Where every gradient of the snapshot is such an arrival, still the parameter's `.grad` and unchanged
    since its backward call ended (the same tensor, the same version: `ParamGradients.arrivals_unchanged` in
    tracer/record/params.py), the snapshot's norms are read from those summaries in one extension call
    (`arrival_norms`), a list of floats, in place of the fused call and its stack: for gradients past what the
    extension's own norms take (NOTE [Native norms] in grad_norms.py, which small CPU gradients take first), that is
    every backward call of a step of one backward after `zero_grad()`. Any other snapshot is torch's: one with
    a gradient accumulated over several backward calls, left by an earlier step, summarised by Python (a CUDA or a
    sparse gradient, a step the Python recorder records), or holding a NaN or an Inf (the kernel's sums leave them
    out).

    What it changes: the norms before clipping of such a step (the row's `param_norms` and `grad_norm`, and
    `grad_norm_before_clip`) are float64 sums, which agree with torch's float32 norms to about 1e-7, as the
    stepped norms do (NOTE [Stepped norms read from the summaries] in stepped.py). But `grad_norm_before_clip`
    stays bit for bit what `clip_grad_norm_` returned: as a clip is about to run, the latest snapshot, if it was
    read from the summaries, is taken again with the fused call from its gradients (`StepCapture.before_change`).
    Those are held weakly until then: one that is no longer any parameter's `.grad` is freed, and no clip reads it.
    A loop whose last full step clipped takes the fused call at once, as it would twice otherwise. What it gives
    up: a gradient that arrived in an earlier backward call of the step and was changed through `.data` (which
    moves no version counter) before a later call's snapshot is read as it arrived.
"""

from __future__ import annotations

from typing import Any

import torch


def arrival_norms(cap: Any, idx: list[int], grads: list[torch.Tensor]) -> list[float] | None:
    """The norms of `grads` (the `.grad` of the monitor's parameters `idx`) read from their arrivals' summaries, or
    None where any one is not an unchanged arrival summarised by the kernel, or counted a NaN or an Inf."""
    traced = cap.traced
    native = traced.rec.native if traced is not None else None
    if native is None:
        return None
    runs = traced.rec.params.arrivals_unchanged(list(map(cap.mon.names.__getitem__, idx)), grads)
    return None if runs is None else native.arrival_norms(runs)
