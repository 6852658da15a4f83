"""Gradient summaries computed on the tensor's own device, fetched to the host once per step.

NOTE [Summary cost]
    Statistics are memory-bound, so the cost is the number of passes over each tensor. The
    ordinary path reads a float32 tensor four times: `sum`, `dot(x, x)`, `aminmax` and
    `dot(sign(x), sign(x))` (the number of non-zeros, because `count_nonzero` is branchy and up to
    20× slower on ReLU-sparse gradients on CPU). NaN and Inf propagate into the sum and the extremes,
    so on CPU the exact NaN/Inf counts and the finite-only statistics are computed only when one of
    those came out non-finite. On CUDA that test would be a host sync per node, so the non-finite
    pass always runs there (extra kernels are cheap on a GPU; a sync stalls the engine).
    Nothing is copied to the host inside a hook: each summary is a small device tensor, and
    `Summariser.finalize` stacks them and makes one transfer per device after backward.

NOTE [Thumbnail views]
    A thumbnail is a block-mean downsampling, to at most `size`×`size`, of a 2-D view chosen by rank:
      0-D  → 1×1;                        1-D [n] → 1×n (a strip);
      2-D  → as is ([batch, features] of a Linear, [out, in] of a weight);
      3-D  [a, b, c] → [a·b, c] (rows: sample×position of a sequence, or sample×channel of Conv1d);
      4-D  [N, C, H, W] → sample 0 only, its C channels as a grid of H×W tiles (a conv gradient, or
           the heads of an attention map [B, heads, T, T]); empty grid cells are NaN;
      5-D+ → [prod(all but last), last].
    `TensorTrace.thumb_view` says which one was used, in words, so the UI can title the heatmap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tracer._model import TensorTrace

_FLOAT_DTYPES = (torch.float32, torch.float64)
_EXACT_FLOAT32_COUNT = 1 << 24  # a float32 dot of ±1/0 counts exactly up to 2**24 elements


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@torch.no_grad()
def _flat_float(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    if flat.is_complex():
        flat = flat.abs()
    if flat.dtype not in _FLOAT_DTYPES:
        flat = flat.float()
    return flat


@torch.no_grad()
def _count_nonzero(flat: torch.Tensor) -> torch.Tensor:
    if flat.numel() <= _EXACT_FLOAT32_COUNT or flat.dtype == torch.float64:
        s = torch.sign(flat)
        return torch.dot(s, s)
    return torch.count_nonzero(flat)


@torch.no_grad()
def raw_stats(t: torch.Tensor) -> torch.Tensor:
    """[min, max, sum, sumsq, nonzero, nan, inf, finite] over the finite elements, on t's device.

    See NOTE [Summary cost]. The result is a float64 tensor of 8 that stays on the device.
    """
    flat = _flat_float(t)
    n = flat.numel()
    dev = flat.device
    if n == 0:
        return torch.tensor([math.nan] * 5 + [0.0, 0.0, 0.0], dtype=torch.float64, device=dev)
    if dev.type == "cpu":
        s = flat.sum()
        ss = torch.dot(flat, flat)
        mn, mx = torch.aminmax(flat)
        if math.isfinite(float(s)) and math.isfinite(float(ss)) and math.isfinite(float(mn)) and \
                math.isfinite(float(mx)):
            nz = _count_nonzero(flat)
            head = torch.stack([mn, mx, s, ss, nz.to(flat.dtype)]).double()
            tail = torch.tensor([0.0, 0.0, float(n)], dtype=torch.float64)
            return torch.cat([head, tail])
        flat = flat.double()  # overflowing sums, or non-finite values: recompute exactly below
    fin = torch.isfinite(flat)
    nan = torch.isnan(flat).sum()
    n_fin = fin.sum()
    inf = (n - n_fin) - nan
    f = torch.where(fin, flat, torch.zeros((), dtype=flat.dtype, device=dev))
    pos_inf = torch.full((), math.inf, dtype=flat.dtype, device=dev)
    mn = torch.where(fin, flat, pos_inf).min()
    mx = torch.where(fin, flat, -pos_inf).max()
    s = f.sum()
    ss = torch.dot(f, f)
    nz = torch.count_nonzero(f)
    return torch.stack([mn.double(), mx.double(), s.double(), ss.double(), nz.double(), nan.double(),
                        inf.double(), n_fin.double()])


def stats_from_raw(raw: np.ndarray) -> dict[str, float]:
    """Host-side: turn `raw_stats` output into `min max mean std norm nan inf zeros`."""
    mn, mx, s, ss, nz, nan, inf, n = (float(v) for v in raw)
    if n <= 0:
        return {"min": math.nan, "max": math.nan, "mean": math.nan, "std": math.nan, "norm": math.nan,
                "nan": nan, "inf": inf, "zeros": 0.0}
    mean = s / n
    var = max(ss - s * mean, 0.0) / max(n - 1.0, 1.0)
    return {"min": mn, "max": mx, "mean": mean, "std": math.sqrt(var), "norm": math.sqrt(max(ss, 0.0)),
            "nan": nan, "inf": inf, "zeros": n - nz}


def thumbnail_view(shape: tuple[int, ...]) -> str:
    """Words for the 2-D view a thumbnail of this shape shows. See NOTE [Thumbnail views]."""
    r = len(shape)
    if r == 0:
        return "scalar"
    if r == 1:
        return f"strip 1×{shape[0]}"
    if r == 2:
        return f"rows {shape[0]} × cols {shape[1]}"
    if r == 3:
        return f"rows {shape[0]}·{shape[1]} (dim0·dim1) × cols {shape[2]}"
    if r == 4:
        return f"sample 0 of {shape[0]}: {shape[1]} channels as tiles of {shape[2]}×{shape[3]}"
    return f"rows {'·'.join(map(str, shape[:-1]))} × cols {shape[-1]}"


@torch.no_grad()
def thumbnail(t: torch.Tensor, size: int) -> torch.Tensor:
    """A float32 2-D block-mean thumbnail of at most size×size, on t's device."""
    x = t.detach()
    if x.is_complex():
        x = x.abs()
    x = x.float()
    r = x.dim()
    if r == 4 and x.shape[0] > 0 and x.shape[1] > 0:
        c, h, w = x.shape[1], x.shape[2], x.shape[3]
        gc = math.ceil(math.sqrt(c))
        gr = math.ceil(c / gc)
        th, tw = max(1, min(h, size // gr)), max(1, min(w, size // gc))
        tiles = F.adaptive_avg_pool2d(x[0:1], (th, tw))[0] if (th, tw) != (h, w) else x[0]
        pad = gr * gc - c
        if pad:
            tiles = torch.cat([tiles, tiles.new_full((pad, th, tw), math.nan)])
        return tiles.reshape(gr, gc, th, tw).permute(0, 2, 1, 3).reshape(gr * th, gc * tw).contiguous()
    if r == 0:
        v = x.reshape(1, 1)
    elif r == 1:
        v = x.reshape(1, -1)
    else:
        v = x.reshape(-1, x.shape[-1])
    rows, cols = v.shape
    if rows == 0 or cols == 0:
        return v.new_zeros((0, 0))
    out_r, out_c = min(size, rows), min(size, cols)
    if (out_r, out_c) == (rows, cols):
        return v.clone()  # never keep a view of a gradient: autograd may reuse its memory
    return F.adaptive_avg_pool2d(v.unsqueeze(0), (out_r, out_c))[0]


@dataclass
class _Pending:
    trace: TensorTrace
    raw: torch.Tensor | None  # stats on device; None when stats come from `stats_of`
    thumb: torch.Tensor | None
    values: torch.Tensor | None
    stats_of: TensorTrace | None = None


class Summariser:
    """Summarises gradients inside hooks; `finalize()` fetches every result in one transfer per device."""

    def __init__(self, thumb: int = 64, keep_values: bool = False) -> None:
        self.thumb = thumb
        self.keep_values = keep_values
        self._pending: list[_Pending] = []

    @torch.no_grad()
    def summarise(self, t: torch.Tensor, stats_of: TensorTrace | None = None) -> TensorTrace:
        """Summarise `t` now (device work only). `stats_of`: a trace of the same elements in another
        shape (a view node's output), whose statistics are reused; only the thumbnail is computed."""
        shape = tuple(t.shape)
        tr = TensorTrace(shape=shape, dtype=dtype_name(t.dtype), thumb_view=thumbnail_view(shape),
                         device=str(t.device))
        raw = None if stats_of is not None else raw_stats(t)
        th = thumbnail(t, self.thumb) if self.thumb > 0 else None
        vals = None
        if self.keep_values:
            v = t.detach()
            vals = (v.float() if v.dtype in (torch.bfloat16, torch.float16) else v).clone()
        self._pending.append(_Pending(tr, raw, th, vals, stats_of))
        return tr

    def finalize(self) -> None:
        """Copy every pending summary to the host: one stacked transfer per device for the stats and
        one for the thumbnails; values (full mode only) are copied one by one."""
        pending, self._pending = self._pending, []
        by_dev: dict[torch.device, list[_Pending]] = {}
        for p in pending:
            dev = p.raw.device if p.raw is not None else (p.thumb.device if p.thumb is not None else None)
            if dev is not None:
                by_dev.setdefault(dev, []).append(p)
        for _dev, items in by_dev.items():
            with_raw = [p for p in items if p.raw is not None]
            if with_raw:
                host = torch.stack([p.raw for p in with_raw]).cpu().numpy()  # type: ignore[misc]
                for p, row in zip(with_raw, host):
                    p.trace.stats = stats_from_raw(row)
            with_thumb = [p for p in items if p.thumb is not None and p.thumb.numel() > 0]
            if with_thumb:
                flat = torch.cat([p.thumb.reshape(-1) for p in with_thumb]).cpu().numpy()  # type: ignore[union-attr]
                off = 0
                for p in with_thumb:
                    shp = tuple(p.thumb.shape)  # type: ignore[union-attr]
                    k = int(np.prod(shp))
                    p.trace.thumb = flat[off:off + k].reshape(shp).copy()
                    off += k
        for p in pending:
            if p.thumb is not None and p.thumb.numel() == 0:
                p.trace.thumb = np.zeros((0, 0), dtype=np.float32)
            if p.stats_of is not None:
                p.trace.stats = dict(p.stats_of.stats)
            if p.values is not None:
                p.trace.values = p.values.cpu().numpy()

    def discard(self) -> None:
        self._pending = []
