"""The summary kernel's fast path: one pass of the C kernel (`summary.kernel`) for statistics and
thumbnail, with everything that depends only on (shape, dtype, thumbnail size) planned once per shape."""

from __future__ import annotations

import ctypes
import math
import struct
from typing import Any, NamedTuple

import numpy as np
import torch

from gradscape.tracer.summary.kernel import check_geometry, native
from gradscape.tracer.summary.stats import dtype_name
from gradscape.tracer.wire import matrix_shape, thumbnail_view

_NATIVE_DTYPES = {torch.float32: "gs_summarise_f32", torch.bfloat16: "gs_summarise_bf16",
                  torch.float16: "gs_summarise_f16", torch.float64: "gs_summarise_f64"}


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


class KernelPlan(NamedTuple):
    """A plan of the native recorder's kernel calls (tracer/record/native.py), by its id: what a summary
    it made is, once it is read (`tracer.record.tables`)."""

    shape: tuple[int, ...]  # the tensor's shape
    dtype: str
    view: str  # thumbnail_view(shape)
    th_shape: tuple[int, int] | None  # the thumbnail's shape as the kernel writes it (of t.T's memory when transposed)
    transposed: bool


KERNEL_PLANS: list[KernelPlan] = []  # by id; a process makes one per (shape, dtype, layout, size)
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # the recorder's dtype codes


def kernel_plan(shape: tuple[int, ...], dtype_code: int, transposed: int, size: int) -> tuple[Any, ...] | None:
    """The native recorder's planner: for a tensor of `shape` (its transpose's memory, contiguous, when
    `transposed`), of dtype `_KERNEL_DTYPES[dtype_code]`, summarised with thumbnails of `size`: (plan id,
    kernel index, the kernel's geometry [n, planes, R, C, kr, kc, gc], doubles it writes, thumbnail cells); None
    when the kernel does not apply (the recorder's arena keeps the cells in bfloat16: NOTE [Arena
    thumbnails]). Checked like every kernel call (`check_geometry`)."""
    if not 0 <= dtype_code < len(_KERNEL_DTYPES) or len(shape) > 16:
        return None
    memory = tuple(reversed(shape)) if transposed else tuple(shape)
    if transposed and len(shape) != 2:
        return None
    n = math.prod(memory)
    if n == 0:
        return None
    geometry, th_shape = _native_geometry(memory, size)
    k = th_shape[0] * th_shape[1] if th_shape is not None else 0
    words = 8 + (k + 1) // 2
    check_geometry(n, geometry, th_shape, 8 * words)
    dtype = dtype_name(_KERNEL_DTYPES[dtype_code])
    KERNEL_PLANS.append(KernelPlan(tuple(shape), dtype, thumbnail_view(tuple(shape)), th_shape, bool(transposed)))
    return len(KERNEL_PLANS) - 1, dtype_code, (n, *geometry), words, k


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
    pass with the C kernel (`summary.kernel`), for CPU float32/bfloat16/float16/float64 tensors; None
    when the kernel is unavailable or does not apply, or when partial sums overflowed (float32's past
    |g| ~1e19, float64's past ~1e154: the torch path recomputes). The thumbnail comes back as a host array: this path
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

