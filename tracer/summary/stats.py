"""Gradient statistics: `raw_stats` on the tensor's own device, turned into named numbers on the host.

NOTE [Summary cost]
    Statistics are memory-bound, so the cost is the number of passes over each tensor. The
    ordinary path reads a float32 tensor four times: `sum`, `dot(x, x)`, `aminmax` and
    `dot(sign(x), sign(x))` (the number of non-zeros, because `count_nonzero` is branchy and much
    slower on ReLU-sparse gradients on CPU). NaN and Inf propagate into the sum and the extremes,
    so on CPU the exact NaN/Inf counts and the finite-only statistics are computed only when one of
    those came out non-finite. On CUDA that test would be a host sync per node, so the non-finite
    pass always runs there (a sync stalls the engine). But each of those ~25 kernels costs the host
    5-20 µs of launch, so a CUDA gradient of up to `staged.STAGE_MAX` elements is not summarised here
    at all: its statistics are computed with every other staged one (NOTE [Staged statistics]).
    Nothing is copied to the host inside a hook: each summary is a small device tensor, and
    `Summariser.finalize` stacks them and makes one transfer per device after backward.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from gradscape.tracer import _compat

_FLOAT_DTYPES = (torch.float32, torch.float64)
_EXACT_FLOAT32_COUNT = 1 << 24  # a float32 dot of ±1/0 counts exactly up to 2**24 elements


@functools.cache  # a handful of dtypes; called for every tensor and node output
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _flat_float(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    if flat.is_complex():
        flat = flat.abs()
    if flat.dtype not in _FLOAT_DTYPES:
        flat = flat.float()
    return flat


_CHUNK = 1 << 18  # elements per pass of the non-zero count (1 MB of float32: stays in cache)
_scratch = threading.local()  # per thread (engine threads of several devices): (device, dtype) → buffer


def _count_nonzero(flat: torch.Tensor) -> torch.Tensor:
    """Σ sign(x)² over chunks through a reused scratch buffer: no allocation the size of the gradient
    (fresh multi-MB allocations inside backward cost page faults that measured more than the pass)."""
    n = flat.numel()
    if n > _EXACT_FLOAT32_COUNT and flat.dtype != torch.float64:
        return torch.count_nonzero(flat)
    if n <= _CHUNK:
        s = torch.sign(flat)
        return torch.dot(s, s)
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None:
        bufs = _scratch.bufs = {}
    key = (flat.device, flat.dtype)
    buf = bufs.get(key)
    if buf is None:
        buf = bufs[key] = torch.empty(_CHUNK, dtype=flat.dtype, device=flat.device)
    total = flat.new_zeros(())
    for start in range(0, n, _CHUNK):
        part = flat[start:start + _CHUNK]
        b = buf[:part.numel()]
        torch.sign(part, out=b)
        total += torch.dot(b, b)
    return total


def raw_stats(t: torch.Tensor) -> torch.Tensor | tuple[float, ...]:
    """[min, max, sum, sumsq, nonzero, nan, inf, finite] over the finite elements.

    See NOTE [Summary cost]. On CPU the result is a tuple of floats (reading a CPU scalar is no
    sync); elsewhere a float64 tensor of 8 that stays on the device until `finalize`.
    """
    flat = _flat_float(t)
    n = flat.numel()
    if n == 0:
        return (math.nan, math.nan, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    if flat.device.type == "cpu":
        s = flat.sum().item()
        ss = torch.dot(flat, flat).item()
        if math.isfinite(s) and math.isfinite(ss):  # a NaN or ±Inf element would have propagated here
            mn, mx = torch.aminmax(flat)
            return (mn.item(), mx.item(), s, ss, _count_nonzero(flat).item(), 0.0, 0.0, float(n))
        flat = flat.double()  # non-finite values, or a sum of squares past float32: recompute exactly
    dev = flat.device
    fin = torch.isfinite(flat)
    nan = torch.isnan(flat).sum()
    n_fin = fin.sum()
    inf = (n - n_fin) - nan
    f = torch.where(fin, flat, torch.zeros((), dtype=flat.dtype, device=dev))
    pos_inf = torch.full((), math.inf, dtype=flat.dtype, device=dev)
    mn = torch.where(fin, flat, pos_inf).min()
    mx = torch.where(fin, flat, -pos_inf).max()
    # sums in float64: a float32 sum of squares overflows past |g| ~ 1e19 (the CPU path recomputes then)
    ss = torch.linalg.vector_norm(f, dtype=torch.float64).square()
    out = torch.stack([mn.double(), mx.double(), f.sum(dtype=torch.float64), ss,
                       torch.count_nonzero(f).double(), nan.double(), inf.double(), n_fin.double()])
    if dev.type == "cpu":
        return tuple(out.tolist())
    return out


def median_sorted(s: Sequence[float]) -> float:
    """The median of a sorted sequence, as `statistics.median` computes it (without its type checks: the
    monitor's triggers and the problem finder take medians at every step)."""
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def median(values: Iterable[float]) -> float:
    return median_sorted(sorted(values))


def stats_from_raw(raw: Any) -> dict[str, float]:
    """Host-side: turn `raw_stats` output into `min max mean std norm nan inf zeros`."""
    mn, mx, s, ss, nz, nan, inf, n = raw if type(raw) is tuple else map(float, raw)
    if n <= 0:
        return {"min": math.nan, "max": math.nan, "mean": math.nan, "std": math.nan, "norm": 0.0,
                "nan": nan, "inf": inf, "zeros": 0.0}
    mean = s / n
    var = max(ss - s * mean, 0.0) / max(n - 1.0, 1.0)
    return {"min": mn, "max": mx, "mean": mean, "std": math.sqrt(var), "norm": math.sqrt(max(ss, 0.0)),
            "nan": nan, "inf": inf, "zeros": n - nz}


def stats_from_array(a: np.ndarray) -> dict[str, float]:
    """Host-side statistics of a small array (see `PendingSummary.host_stats`)."""
    v = np.asarray(a, dtype=np.float64).ravel()
    nan = int(np.isnan(v).sum())
    inf = int(np.isinf(v).sum())
    f = v[np.isfinite(v)] if nan or inf else v
    if f.size == 0:
        raw = np.array([math.nan, math.nan, 0.0, 0.0, 0.0, nan, inf, 0.0])
    else:
        raw = np.array([f.min(), f.max(), f.sum(), float(np.dot(f, f)), float(np.count_nonzero(f)), nan, inf,
                        float(f.size)])
    return stats_from_raw(raw)



class grad_off:
    """`torch.no_grad()` for hot paths: the decorator form creates and clones a context object on
    every call; this only flips the flag when it is on (it is off in a plain backward)."""

    __slots__ = ("prev",)

    def __enter__(self) -> None:
        self.prev = torch.is_grad_enabled()
        if self.prev:
            _compat.set_grad_enabled(False)

    def __exit__(self, *exc: object) -> None:
        if self.prev:
            _compat.set_grad_enabled(True)

