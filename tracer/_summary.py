"""Gradient summaries computed on the tensor's own device, fetched to the host once per step.

NOTE [Summary cost]
    Statistics are memory-bound, so the cost is the number of passes over each tensor. The
    ordinary path reads a float32 tensor four times: `sum`, `dot(x, x)`, `aminmax` and
    `dot(sign(x), sign(x))` (the number of non-zeros, because `count_nonzero` is branchy and much
    slower on ReLU-sparse gradients on CPU). NaN and Inf propagate into the sum and the extremes,
    so on CPU the exact NaN/Inf counts and the finite-only statistics are computed only when one of
    those came out non-finite. On CUDA that test would be a host sync per node, so the non-finite
    pass always runs there (extra kernels are cheap on a GPU; a sync stalls the engine).
    Nothing is copied to the host inside a hook: each summary is a small device tensor, and
    `Summariser.finalize` stacks them and makes one transfer per device after backward.

NOTE [Sparse gradients]
    A sparse gradient (COO, e.g. from `nn.Embedding(sparse=True)`, or CSR/CSC/BSR/BSC) is never made
    dense: it is coalesced (each stored element once) and its statistics are those of the whole tensor,
    computed from the stored values with the unstored elements counted as zeros. Its thumbnail is the
    same block-mean picture a dense gradient gets, summed cell by cell from the stored elements.

NOTE [Thumbnail views]
    A thumbnail is a block-mean downsampling, to at most `size`×`size`, of a 2-D view chosen by rank:
      0-D  → 1×1;                        1-D [n] → 1×n (a strip);
      2-D  → as is ([batch, features] of a Linear, [out, in] of a weight);
      3-D  [a, b, c] → [a·b, c] (rows: sample×position of a sequence, or sample×channel of Conv1d);
      4-D  [N, C, H, W] → sample 0 only, its C channels as a grid of H×W tiles (a conv gradient, or
           the heads of an attention map [B, heads, T, T]); empty grid cells are NaN;
      5-D+ → [prod(all but last), last].
    `TensorTrace.thumb_view` says which one was used, in words, so the UI can title the heatmap.

NOTE [Views share a buffer]
    A view node (`VIEW_NODES` in `tracer._labels`: TBackward0, CloneBackward0, ...) sends on the memory
    that arrived, in another shape, and its hook passes the arriving trace as `stats_of`. Where the fast
    path summarised what arrived, and what is sent would be read by the very same kernel call (the same
    address, kernel and geometry: a Linear's weight gradient and its transpose share their plan's
    geometry), the first call's buffer is the second's result too: only the trace is new, and `finalize`
    reads the buffer once per trace (transposing the thumbnail where that trace's plan says so).
"""

from __future__ import annotations

import ctypes
import functools
import math
import struct
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from gradscape.tracer import _compat
from gradscape.tracer._model import TensorTrace
from gradscape.tracer._native import check_geometry, native
from gradscape.tracer.wire import matrix_shape, thumbnail_view

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
    out = torch.stack([mn.double(), mx.double(), f.sum().double(), torch.dot(f, f).double(),
                       torch.count_nonzero(f).double(), nan.double(), inf.double(), n_fin.double()])
    if dev.type == "cpu":
        return tuple(out.tolist())
    return out


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
    """Host-side statistics of a small array (see `_Pending.host_stats`)."""
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


def _fits(shape: tuple[int, ...], size: int) -> bool:
    """True when the thumbnail is the whole tensor, uncompressed (see NOTE [Thumbnail views])."""
    if len(shape) == 4:
        return False
    rows, cols = matrix_shape(shape)
    return rows <= size and cols <= size


def _block_mean(v: torch.Tensor, dim: int, out: int) -> torch.Tensor:
    """Mean over consecutive blocks of `dim` so that at most `out` remain; the last block may be
    shorter. One pass over `v`, no window overlap (cheaper than adaptive pooling by 2-3x on CPU)."""
    n = v.shape[dim]
    if n <= out:
        return v
    k = math.ceil(n / out)
    full = (n // k) * k
    head = v.narrow(dim, 0, full)
    shape = list(v.shape)
    shape[dim:dim + 1] = [n // k, k]
    parts = [head.reshape(shape).mean(dim + 1)]
    if full < n:
        parts.append(v.narrow(dim, full, n - full).mean(dim, keepdim=True))
    return torch.cat(parts, dim) if len(parts) > 1 else parts[0]


def thumbnail(t: torch.Tensor, size: int) -> torch.Tensor:
    """A float32 2-D block-mean thumbnail of at most size×size, on t's device. Always a new tensor
    (never a view of a gradient: autograd may reuse that memory)."""
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
        tiles = _block_mean(_block_mean(x[0], 1, th), 2, tw)
        th, tw = tiles.shape[1], tiles.shape[2]
        pad = gr * gc - c
        if pad:
            tiles = torch.cat([tiles, tiles.new_full((pad, th, tw), math.nan)])
        return tiles.reshape(gr, gc, th, tw).permute(0, 2, 1, 3).reshape(gr * th, gc * tw).contiguous()
    v = x.reshape(matrix_shape(tuple(x.shape)))
    if v.shape[0] == 0 or v.shape[1] == 0:
        return v.new_zeros((0, 0))
    out = _block_mean(_block_mean(v, 0, size), 1, size)
    return out.clone() if out.data_ptr() == v.data_ptr() or out.data_ptr() == t.data_ptr() else out


_STRIDED = torch.strided
_MAX_DENSE_VALUES = 1 << 20  # a sparse gradient's values are kept (tensors="full") up to this many elements


def as_coalesced_coo(t: torch.Tensor) -> torch.Tensor | None:
    """`t` (sparse COO, CSR, CSC, BSR or BSC) as a coalesced COO tensor, never dense: each stored
    element once, duplicates summed. None for a layout without stored values to read."""
    try:
        coo = t.detach() if t.layout == torch.sparse_coo else t.detach().to_sparse_coo()
        return coo if coo.is_coalesced() else coo.coalesce()
    except (RuntimeError, NotImplementedError):
        return None


def with_implicit_zeros(raw: Any, zeros: int) -> Any:
    """`raw_stats` of a sparse tensor's stored values, made the statistics of the whole tensor by
    adding its `zeros` unstored elements: they count as finite zeros, and bound min and max by 0."""
    if zeros <= 0:
        return raw
    if isinstance(raw, tuple):
        mn, mx, s, ss, nz, nan, inf, n = raw
        mn = 0.0 if math.isnan(mn) else min(mn, 0.0)
        mx = 0.0 if math.isnan(mx) else max(mx, 0.0)
        return (mn, mx, s, ss, nz, nan, inf, n + zeros)
    zero = raw.new_zeros(())
    return torch.stack([torch.fmin(raw[0], zero), torch.fmax(raw[1], zero), raw[2], raw[3], raw[4], raw[5],
                        raw[6], raw[7] + zeros])


def sparse_thumbnail(coo: torch.Tensor, size: int) -> tuple[torch.Tensor, str]:
    """The block-mean thumbnail of a coalesced sparse COO tensor, computed from its stored elements
    alone (no dense copy): each stored value is added to the cell of its block, and each cell divided
    by its block's size. For every rank but 4 it equals `thumbnail` of the dense tensor; a 4-D
    tensor is shown as rank 5+ would be (rows: the leading dimensions flattened)."""
    shape = tuple(coo.shape)
    view = thumbnail_view(shape) if len(shape) != 4 else f"rows {'·'.join(map(str, shape[:-1]))} × cols {shape[-1]}"
    rows, cols = matrix_shape(shape)
    dev = coo.device
    if rows == 0 or cols == 0:
        return torch.zeros((0, 0), device=dev), view
    kr, kc = max(1, -(-rows // size)), max(1, -(-cols // size))
    nr, nc = -(-rows // kr), -(-cols // kc)
    sd = coo.sparse_dim()
    idx, vals = coo._indices(), coo._values()
    if vals.is_complex():
        vals = vals.abs()
    dense_n = math.prod(shape[sd:])
    strides = [math.prod(shape[i + 1:sd]) for i in range(sd)]
    lin = (idx * torch.tensor(strides, dtype=idx.dtype, device=dev)[:, None]).sum(0)  # over the sparse dims
    flat = (lin[:, None] * dense_n + torch.arange(dense_n, device=dev)).reshape(-1)  # index in the whole tensor
    r, c = flat // cols, flat % cols
    sums = torch.zeros(nr * nc, dtype=torch.float32, device=dev)
    sums.index_add_(0, (r // kr) * nc + c // kc, vals.reshape(-1).float())
    per_row = (rows - torch.arange(nr, device=dev) * kr).clamp(max=kr)
    per_col = (cols - torch.arange(nc, device=dev) * kc).clamp(max=kc)
    return sums.view(nr, nc) / (per_row[:, None] * per_col[None, :]).float(), view


_NATIVE_DTYPES = {torch.float32: "gs_summarise_f32", torch.bfloat16: "gs_summarise_bf16"}


def _same_call(a: _NativePlan, b: _NativePlan) -> bool:
    """True when plans `a` and `b` make the very same kernel call on a tensor at the same address:
    the same kernel and the same geometry (a plan and its transposed twin share the geometry array)."""
    return a.fn is b.fn and (a.geom == b.geom or a.geom_array[:] == b.geom_array[:])


class _NativePlan(NamedTuple):
    """Everything about a kernel call and its trace that depends only on (shape, dtype, size)."""

    fn: Any  # the kernel
    geom: int  # address of its geometry array
    buf_type: Any  # ctypes type of its output buffer
    th_shape: tuple[int, int] | None  # the thumbnail's shape
    geom_array: Any  # the geometry array itself (kept alive here)
    shape: tuple[int, ...]  # the tensor's shape, one tuple shared by every trace of that shape
    dtype: str
    view: str  # thumbnail_view(shape)
    transposed: bool = False  # a plan for t.T's memory: the kernel's thumbnail is t's, transposed


def _transposed_plan(t: torch.Tensor, size: int, plan: _NativePlan) -> None:
    """Remember, for a 2-D `t` whose transpose is contiguous, the plan of `t.t()` under t's own key
    in `_transposed_plans` (see `native_summary`), so the fast path takes such a tensor too."""
    shape = tuple(t.shape)
    plans = _transposed_plans.setdefault(size, {})
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    plans[(t.shape, t.dtype)] = plan._replace(shape=shape, view=thumbnail_view(shape), transposed=True)


# per size: (torch.Size, dtype) → plan; a model has few shapes
_native_plans: dict[int, dict[tuple[Any, ...], _NativePlan]] = {}
_transposed_plans: dict[int, dict[tuple[Any, ...], _NativePlan]] = {}  # the same, for 2-D t with t.T contiguous
_MAX_PLANS = 4096  # distinct shapes remembered per size; past that the cache starts over
_unpack_stats = struct.Struct("8d").unpack_from  # the 8 statistics at the head of the kernel's buffer
_F32 = np.dtype(np.float32)


def _native_geometry(shape: tuple[int, ...], size: int) -> tuple[list[int], tuple[int, int] | None]:
    """The kernel's thumbnail geometry `[planes, R, C, kr, kc, grid columns]` (see `_fastsum.c`) and
    the thumbnail's shape, laid out exactly as `thumbnail` does (NOTE [Thumbnail views])."""
    if size <= 0:
        return [0, 0, 0, 1, 1, 1], None
    if len(shape) == 4:  # sample 0: C planes of H×W, as a grid of gr×gc tiles
        c, h, w = shape[1], shape[2], shape[3]
        gc = math.ceil(math.sqrt(c))
        gr = math.ceil(c / gc)
        th, tw = max(1, min(h, size // gr)), max(1, min(w, size // gc))
        kr, kc = -(-h // th), -(-w // tw)
        return [c, h, w, kr, kc, gc], (gr * -(-h // kr), gc * -(-w // kc))
    rows, cols = matrix_shape(shape)
    kr, kc = -(-rows // size), -(-cols // size)
    return [1, rows, cols, kr, kc, 1], (-(-rows // kr), -(-cols // kc))


def _native_plan(t: torch.Tensor, size: int) -> _NativePlan | None:
    """Everything about a `native_summary` call that depends only on (shape, dtype, size), made
    once per shape; None when the kernel is unavailable or does not apply."""
    lib = native()
    name = _NATIVE_DTYPES.get(t.dtype)
    n = t.numel()
    if lib is None or name is None or n == 0:
        return None
    geometry, th_shape = _native_geometry(tuple(t.shape), size)
    k = th_shape[0] * th_shape[1] if th_shape is not None else 0
    geom = (ctypes.c_int64 * 7)(n, *geometry)
    buf_type = ctypes.c_double * (8 + (k + 1) // 2)  # 8 statistics, then k float32 thumbnail cells
    check_geometry(n, geometry, th_shape, ctypes.sizeof(buf_type))  # raises rather than overrun a buffer
    shape = tuple(t.shape)
    plan = _NativePlan(getattr(lib, name), ctypes.addressof(geom), buf_type, th_shape, geom, shape,
                       dtype_name(t.dtype), thumbnail_view(shape))
    plans = _native_plans.setdefault(size, {})
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    plans[(t.shape, t.dtype)] = plan
    return plan


def native_summary(t: torch.Tensor, size: int) -> tuple[tuple[float, ...], np.ndarray | None] | None:
    """Statistics and block-mean thumbnail (every rank, the tile grid of rank 4 included) in one
    pass with the C kernel (`tracer._native`), for CPU float32/bfloat16 tensors; None when the
    kernel is unavailable or does not apply, or when float32 partial sums overflowed (|g| > ~1e19:
    the torch path recomputes in float64). The thumbnail comes back as a host array: this path
    never leaves the CPU.

    This runs in every hook, so the Python around the kernel is kept short (each step measured):
    the geometry is cached per shape, the kernel takes three arguments, and the statistics and the
    thumbnail come back in one ctypes buffer that the thumbnail array views (`ndarray.ctypes.data`
    alone costs more than the kernel on a small tensor)."""
    if not t.is_cpu or native() is None:
        return None
    if t.dim() == 2 and not t.is_contiguous() and t.t().is_contiguous():
        # A transposed matrix (a Linear's weight gradient on its way through TBackward0): the same
        # elements, so the same statistics, and its block means are those of t.T transposed (the
        # blocks line up: ceil(rows/size) and ceil(cols/size) swap places). No copy needed, and the
        # plan is remembered for the summariser's fast path, which then takes such a tensor as it is.
        res = native_summary(t.t(), size)
        if (t.shape, t.dtype) not in _transposed_plans.get(size, {}):
            plan = _native_plans.get(size, {}).get((t.shape[::-1], t.dtype))
            if plan is not None:
                _transposed_plan(t, size, plan)
        if res is None or res[1] is None:
            return res
        return res[0], np.ascontiguousarray(res[1].T)
    plan = _native_plans.get(size, {}).get((t.shape, t.dtype))
    if plan is None:
        plan = _native_plan(t, size)
        if plan is None:
            return None
    fn, geom, buf_type, th_shape = plan[:4]
    if not t.is_contiguous():
        t = t.detach().contiguous()
    buf = buf_type()
    if fn(t.data_ptr(), geom, buf):
        return None
    return _unpack_stats(buf), None if th_shape is None else np.ndarray(th_shape, _F32, buf, 64)


@dataclass(slots=True)
class _Pending:
    trace: TensorTrace
    raw: torch.Tensor | tuple[float, ...] | None  # see raw_stats; None when stats come from elsewhere
    thumb: torch.Tensor | np.ndarray | None  # an ndarray when already on the host
    values: torch.Tensor | None
    stats_of: TensorTrace | None = None
    host_stats: bool = False  # small tensor: its thumbnail holds every value; stats computed from it
    view: str | None = None  # the thumbnail's view in words, where it is not thumbnail_view(shape)


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


_words: dict[tuple[torch.dtype, torch.device], tuple[str, str]] = {}  # (dtype, device) → their names
_views: dict[tuple[int, ...], str] = {}  # shape → thumbnail_view(shape); a model has few shapes


class Summariser:
    """Summarises gradients inside hooks; `finalize()` fetches every result in one transfer per device."""

    def __init__(self, thumb: int = 64, keep_values: bool = False) -> None:
        self.thumb = thumb
        self.keep_values = keep_values
        self._pending: list[_Pending] = []
        # the fast path's kernel results still in their buffers: (trace, buffer, plan), read at finalize
        self._buffers: list[tuple[TensorTrace, Any, _NativePlan]] = []
        # the fast path's traces of this step, by id: (the trace, its buffer, its plan, the tensor's address),
        # so a view of the same memory reuses the buffer (NOTE [Views share a buffer])
        self._fast: dict[int, tuple[TensorTrace, Any, _NativePlan, int]] = {}
        # the fast path's plans ((torch.Size, dtype) → _NativePlan); none when values are kept
        self._plans: dict[tuple[Any, ...], _NativePlan] = {} if keep_values else \
            _native_plans.setdefault(thumb, {})
        self._tplans: dict[tuple[Any, ...], _NativePlan] = {} if keep_values else \
            _transposed_plans.setdefault(thumb, {})

    def summarise(self, t: torch.Tensor, stats_of: TensorTrace | None = None) -> TensorTrace:
        """Summarise `t` now (device work only). `stats_of`: a trace of the same elements in another
        shape (a view node's output), whose statistics are reused; only the thumbnail is computed."""
        with grad_off():
            return self.summarise_no_grad(t, stats_of)

    def summarise_no_grad(self, t: torch.Tensor, stats_of: TensorTrace | None) -> TensorTrace:
        """`summarise` for a caller that has already turned grad mode off (the recorder's hooks).

        The fast path, for a contiguous CPU tensor of a shape and dtype the kernel has seen: one
        kernel call into a fresh buffer, and a trace whose shape, dtype and view words come from
        the plan; the buffer is read at `finalize`, in a loop of its own. It runs once per gradient
        inside backward, where every Python operation costs more than when warm (the kernels around
        it have evicted the interpreter's caches), so it does as few as it can."""
        if t.is_cpu and t.layout is _STRIDED:
            if t.is_contiguous():
                plan = self._plans.get((t.shape, t.dtype))
            else:  # a Linear's weight gradient on its way through TBackward0, say
                plan = self._tplans.get((t.shape, t.dtype))
                if plan is not None and t.stride() != (1, plan.shape[0]):
                    plan = None
            if plan is not None:
                ptr = t.data_ptr()
                if stats_of is not None:  # NOTE [Views share a buffer]
                    prev = self._fast.get(id(stats_of))
                    if prev is not None and prev[0] is stats_of and prev[3] == ptr and _same_call(prev[2], plan):
                        tr = TensorTrace(plan.shape, plan.dtype, {}, None, plan.view, None, "cpu")
                        self._buffers.append((tr, prev[1], plan))
                        return tr
                buf = plan.buf_type()
                if not plan.fn(ptr, plan.geom, buf):
                    tr = TensorTrace(plan.shape, plan.dtype, {}, None, plan.view, None, "cpu")
                    self._buffers.append((tr, buf, plan))
                    self._fast[id(tr)] = (tr, buf, plan, ptr)
                    return tr
        return self._summarise(t, stats_of)

    def _summarise(self, t: torch.Tensor, stats_of: TensorTrace | None) -> TensorTrace:
        if t.layout is not _STRIDED:
            return self._summarise_sparse(t)
        shape = tuple(t.shape)
        dt, dev = t.dtype, t.device
        words = _words.get((dt, dev))
        if words is None:
            words = _words[(dt, dev)] = (dtype_name(dt), str(dev))
        tr = TensorTrace(shape, words[0], {}, None, "", None, words[1])  # thumb_view: at finalize
        fast = native_summary(t, self.thumb)
        if fast is not None:  # a shape's first call (it makes the fast path's plan), or values kept
            self._pending.append(_Pending(tr, fast[0], fast[1], self._values(t), None, False))
            return tr
        th = thumbnail(t, self.thumb) if self.thumb > 0 else None
        # NOTE [Summary cost]: a small tensor costs more in op dispatch than in memory passes; its
        # thumbnail is an exact copy, so its statistics are computed on the host at finalize.
        host = stats_of is None and th is not None and t.dtype != torch.float64 and _fits(shape, self.thumb)
        raw = None if stats_of is not None or host else raw_stats(t)
        self._pending.append(_Pending(tr, raw, th, self._values(t), stats_of, host))
        return tr

    def _summarise_sparse(self, t: torch.Tensor) -> TensorTrace:
        """A sparse gradient (nn.Embedding(sparse=True), a sparse matmul): see NOTE [Sparse gradients]."""
        tr = TensorTrace(tuple(t.shape), dtype_name(t.dtype), {}, None, "", None, str(t.device))
        coo = as_coalesced_coo(t)
        if coo is None:
            tr.thumb_view = f"not summarised: {str(t.layout).replace('torch.', '')} layout"
            return tr
        vals = coo._values()
        raw = with_implicit_zeros(raw_stats(vals), t.numel() - vals.numel())
        th, view = sparse_thumbnail(coo, self.thumb) if self.thumb > 0 else (None, None)
        values = None
        if self.keep_values and t.numel() <= _MAX_DENSE_VALUES:
            values = self._values(coo.to_dense())
        self._pending.append(_Pending(tr, raw, th, values, None, False, view))
        return tr

    def _values(self, t: torch.Tensor) -> torch.Tensor | None:
        if not self.keep_values:
            return None
        v = t.detach()
        return (v.float() if v.dtype in (torch.bfloat16, torch.float16) else v).clone()

    def finalize(self) -> None:
        """Bring every pending summary to the host: CPU results are used in place; for each other
        device, one stacked transfer for the statistics and one for the thumbnails. Values (full
        mode only) are copied one by one."""
        buffers, self._buffers = self._buffers, []
        self._fast = {}
        for tr, buf, plan in buffers:  # the fast path's kernel results
            tr.stats = stats_from_raw(_unpack_stats(buf))
            if plan.th_shape is not None:
                th = np.ndarray(plan.th_shape, _F32, buf, 64)  # a view of the buffer, which it keeps alive
                tr.thumb = np.ascontiguousarray(th.T) if plan.transposed else th
        pending, self._pending = self._pending, []
        remote: dict[torch.device, list[_Pending]] = {}
        for p in pending:
            p.trace.thumb_view = p.view or _view_of(p.trace.shape)
            if isinstance(p.thumb, torch.Tensor) and p.thumb.device.type == "cpu":
                p.thumb = p.thumb.numpy()
            if isinstance(p.thumb, np.ndarray):
                p.trace.thumb = p.thumb if p.thumb.size else np.zeros((0, 0), dtype=np.float32)
                p.thumb = None
            dev = p.raw.device if isinstance(p.raw, torch.Tensor) else (p.thumb.device if p.thumb is not None else None)
            if dev is not None:
                remote.setdefault(dev, []).append(p)
        for items in remote.values():
            on_device = [p for p in items if isinstance(p.raw, torch.Tensor)]
            if on_device:
                host = torch.stack([p.raw for p in on_device]).cpu().numpy()  # type: ignore[misc]
                for p, row in zip(on_device, host):
                    p.trace.stats = stats_from_raw(row)
            with_thumb = [p for p in items if p.thumb is not None]
            if with_thumb:
                flat = torch.cat([p.thumb.reshape(-1) for p in with_thumb  # type: ignore[misc]
                                  if isinstance(p.thumb, torch.Tensor)]).cpu().numpy()
                off = 0
                for p in with_thumb:
                    shp = tuple(p.thumb.shape)  # type: ignore[union-attr]
                    k = int(np.prod(shp))
                    p.trace.thumb = flat[off:off + k].reshape(shp)
                    off += k
        for p in pending:
            if isinstance(p.raw, tuple):
                p.trace.stats = stats_from_raw(p.raw)
            if p.host_stats and p.trace.thumb is not None:
                p.trace.stats = stats_from_array(p.trace.thumb)
            if p.stats_of is not None:
                p.trace.stats = dict(p.stats_of.stats)
            if p.values is not None:
                p.trace.values = p.values.cpu().numpy()

    def discard(self) -> None:
        self._pending = []
        self._buffers = []
        self._fast = {}


def _view_of(shape: tuple[int, ...]) -> str:
    view = _views.get(shape)
    if view is None:
        if len(_views) > 4096:  # shapes that keep changing (variable sequence lengths)
            _views.clear()
        view = _views[shape] = thumbnail_view(shape)
    return view
