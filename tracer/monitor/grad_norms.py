"""The gradients' norms the monitor takes: the gradients set, one fused call for a list of them (NOTE [Norms
before and after clipping] in capture.py), or one extension call for small CPU ones (NOTE [Native norms]), a gather
from a norm vector, and a vector's total.

NOTE [Native norms]
    On the CPU, torch's fused norms of a few small gradients cost far more than their arithmetic: `_foreach_norm`
    runs one norm op per gradient there, each through the dispatcher, and `stack` joins them (docs/costs.md has
    what that costs a monitored step). Where the native recorder is built, `native_norms` asks its extension
    instead: one call that checks every gradient first (dense, in any order of its dimensions, on the CPU,
    float32, bfloat16, float16 or float64, `NATIVE_MOST` elements together at most, past which torch's threads
    may do better) and then runs the summary kernel over each without a thumbnail. Each norm is the square root
    of the kernel's sum of squares, in float64: NaN for a gradient with a NaN, inf for one with an Inf and no NaN,
    as torch's norms give them. They agree with torch's float32 norms to about 1e-7, not bit for bit, so they
    serve where no exact equality is promised: a backward's snapshot, which a clip takes again with torch's call
    before it runs (`StepCapture.before_change`: `grad_norm_before_clip` stays what `clip_grad_norm_` returned),
    the norms an untraced step's optimizer stepped with, and the norms after a clip. Anything else (a CUDA or a
    sparse gradient, a DTensor shard, a larger model) takes torch's fused call, as before.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer.record import native
from gradscape.tracer.summary.stats import grad_off

# a vector of norms: torch's (a 1-d tensor on the gradients' device), or floats read from the native recorder's
# summaries (NOTE [Norms after a backward from the arrivals] in arrival_norms.py)
Norms = torch.Tensor | list[float]


def norms_of(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of each gradient, stacked (one fused call; per tensor for what foreach refuses). A DTensor
    gradient (FSDP2's shards) counts as this rank's shard: its norm is the local part's, read with no collective
    (a rank's row holds its own shards' norms)."""
    with grad_off():  # `torch.no_grad()` as a hot path needs it (tracer/summary/stats.py)
        try:
            norms = _compat.foreach_norm(grads)
            if norms and type(norms[0]) is not torch.Tensor:  # DTensors: the local shards' norms
                norms = _compat.foreach_norm([_dense(g) for g in grads])
            return torch.stack(norms)
        except (RuntimeError, TypeError, NotImplementedError):
            return torch.stack([torch.linalg.vector_norm(_dense(g).float()).to(grads[0].device) for g in grads])


NATIVE_MOST = 1 << 18  # elements, all the gradients together, that `native_norms` takes (NOTE [Native norms])


def native_norms(grads: list[torch.Tensor]) -> list[float] | None:
    """The 2-norm of each of `grads` from the extension (NOTE [Native norms]), or None where it does not take them
    all (or is not built)."""
    ext = native.extension()
    return None if ext is None else ext.norms(grads, NATIVE_MOST)  # type: ignore[no-any-return]


def quick_norms(grads: list[torch.Tensor]) -> Norms:
    """The 2-norm of each of `grads`: the extension's where it takes them (floats), else torch's fused call."""
    read = native_norms(grads)
    return norms_of(grads) if read is None else read


def set_grads(params: list[torch.Tensor]) -> tuple[list[int], list[torch.Tensor]]:
    """The `.grad` of each of `params` that has one, with its position in `params`: one extension call where it is
    built and every one is a plain tensor or parameter."""
    ext = native.extension()
    read = None if ext is None else ext.grads(params)
    if read is not None:
        return read  # type: ignore[no-any-return]
    idx, grads = [], []
    for i, p in enumerate(params):
        g = p.grad
        if g is not None:
            idx.append(i)
            grads.append(g)
    return idx, grads


def gather(vec: Norms, pos: list[int]) -> Norms:
    """`vec[pos]` in one op: `vec` itself when `pos` is all of it, in order; a slice (a view, ~1 µs) when `pos` is
    a run of consecutive positions (one optimizer's parameters in a model's order: a GAN's generator or
    discriminator); else an index op (~15 µs, with the index tensor it makes). A list of floats, as a list."""
    if pos and pos == list(range(pos[0], pos[0] + len(pos))):
        return vec if len(pos) == len(vec) else vec[pos[0]:pos[0] + len(pos)]
    if isinstance(vec, list):
        return [vec[k] for k in pos]
    return vec[torch.tensor(pos, dtype=torch.long, device=vec.device)]


def joined(parts: list[Any]) -> Norms:
    """Norms picked from several vectors (0-d tensors or floats) as one vector: stacked where every one is torch's,
    else a list of floats (those read from summaries are on the CPU: reading a tensor's waits for nothing)."""
    if all(isinstance(v, torch.Tensor) for v in parts):
        return torch.stack(parts)
    return [float(v) for v in parts]


def total_of(norms: Norms) -> torch.Tensor | float:
    """The 2-norm of a vector of norms: torch's `vector_norm`, as `clip_grad_norm_` takes it, of a tensor; the square
    root of the float64 sum of squares of a list of floats."""
    if isinstance(norms, torch.Tensor):
        with grad_off():
            return torch.linalg.vector_norm(norms)
    return math.sqrt(math.fsum(map(operator.mul, norms, norms)))  # (each v * v, with no Python frame)


def _dense(g: torch.Tensor) -> torch.Tensor:
    if g.layout != torch.strided:
        return g.coalesce().values() if g.is_sparse else g.to_dense()
    local = getattr(g, "to_local", None)  # a DTensor shard (FSDP2): this rank's part, no collective
    return local() if callable(local) else g
