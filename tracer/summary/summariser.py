"""`Summariser`: gradient summaries computed on the tensor's own device inside the hooks, fetched to
the host once per step (`finalize`). Statistics: `summary.stats`; thumbnails: `summary.thumbnails`;
sparse gradients: `summary.sparse`; the C kernel's fast path: `summary.fastpath`.

NOTE [Views share a buffer]
    A view node (`VIEW_NODES` in `tracer.record.labels`: TBackward0, CloneBackward0, ...) sends on the memory
    that arrived, in another shape, and its hook passes the arriving trace as `stats_of`. Where the fast
    path summarised what arrived, and what is sent would be read by the very same kernel call (the same
    address, kernel and geometry: a Linear's weight gradient and its transpose share their plan's
    geometry), the first call's buffer is the second's result too: only the trace is new, and `finalize`
    reads the buffer once per trace (transposing the thumbnail where that trace's plan says so).

NOTE [Summary arena]
    The kernel writes each summary (8 statistics, then the thumbnail) into the step's arena: numpy float64 chunks,
    each passed to the kernel by address, each chunk twice the last (32 KiB to 512 KiB), handed out in order. Passing
    an address into it costs the ctypes call less than a fresh buffer per call would (an allocation and a conversion:
    a third of the fast path's time on an 8×32 gradient). At `finalize` each trace's thumbnail is read from its part
    of a chunk, rounded to bfloat16's precision as the native recorder's arena keeps it (NOTE [Arena thumbnails] in
    `bfloat16.py`); a new step starts a new chunk.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gradscape.tracer import _compat
from gradscape.tracer._model import TensorTrace
from gradscape.tracer.summary import bfloat16
from gradscape.tracer.summary.fastpath import (
    _native_plans,
    _NativePlan,
    _same_call,
    _transposed_plans,
    _unpack_stats,
    native_summary,
)
from gradscape.tracer.summary.sparse import as_coalesced_coo, sparse_thumbnail, with_implicit_zeros
from gradscape.tracer.summary.staged import StagedStats
from gradscape.tracer.summary.stats import dtype_name, grad_off, raw_stats, stats_from_array, stats_from_raw
from gradscape.tracer.summary.thumbnails import fits_whole, thumbnail
from gradscape.tracer.wire import thumbnail_view

_STRIDED = torch.strided
_MAX_DENSE_VALUES = 1 << 20  # a sparse gradient's values are kept (tensors="full") up to this many elements
_F32 = np.dtype(np.float32)
_FIRST_CHUNK = 1 << 12  # the arena's first chunk: 32 KiB (NOTE [Summary arena])
_CHUNK_DOUBLES = 1 << 16  # and its largest: 512 KiB, unless one summary needs more
_MAX_KEYED = 4096  # layouts remembered per thumbnail size; past that the cache starts over
# per thumbnail size: (torch.Size, strides, dtype) → (plan, doubles its kernel call writes)
_keyed_plans: dict[int, dict[tuple[Any, ...], tuple[_NativePlan, int]]] = {}


@dataclass(slots=True)
class PendingSummary:
    """A summary whose results are still on the device (or still to be derived), until `finalize`."""

    trace: TensorTrace
    raw: torch.Tensor | tuple[float, ...] | None  # see raw_stats; None when stats come from elsewhere
    thumb: torch.Tensor | np.ndarray | None  # an ndarray when already on the host
    values: torch.Tensor | None
    stats_of: TensorTrace | None = None
    host_stats: bool = False  # small tensor: its thumbnail holds every value; stats computed from it
    view: str | None = None  # the thumbnail's view in words, where it is not thumbnail_view(shape)


_words: dict[tuple[torch.dtype, torch.device], tuple[str, str]] = {}  # (dtype, device) → their names
_views: dict[tuple[int, ...], str] = {}  # shape → thumbnail_view(shape); a model has few shapes
# the statistics of no elements (NaN extremes, mean and deviation; no norm, NaN, Inf or zero counted)
_EMPTY_STATS = stats_from_raw((math.nan, math.nan, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))


class Summariser:
    """Summarises gradients inside hooks; `finalize()` fetches every result in one transfer per device."""

    def __init__(self, thumb: int = 64, keep_values: bool = False, repeat_thumb: int | None = None) -> None:
        # the thumbnail sizes of a step's first backward calls and of the calls that repeat one (NOTE [Repeated
        # calls' thumbnails] in tracer/record/call_thumbs.py); `use_thumb` sets the one in use
        self.sizes = (thumb, thumb if repeat_thumb is None else repeat_thumb)
        self.keep_values = keep_values
        # the step's thumbnail budget in cells (None: none), which the native recorder applies while it records
        # (NOTE [Budget while recording] in tracer/record/csrc/budget.h); the step's end applies it to everything
        self.budget: int | None = None
        self._pending: list[PendingSummary] = []
        # the fast path's kernel results, still in the arena: (trace, chunk, offset in doubles, plan), read
        # at finalize (NOTE [Summary arena])
        self._buffers: list[tuple[TensorTrace, Any, int, _NativePlan]] = []
        # the fast path's traces of this step, by id: (the trace, its chunk, its offset, its plan, the tensor's
        # address), so a view of the same memory reuses the result (NOTE [Views share a buffer])
        self._fast: dict[int, tuple[TensorTrace, Any, int, _NativePlan, int]] = {}
        # the fast path's plans ((torch.Size, dtype) → _NativePlan), per thumbnail size (`use_thumb`); none shared
        # when values are kept
        self.thumb: int
        self._plans: dict[tuple[Any, ...], _NativePlan]
        self._tplans: dict[tuple[Any, ...], _NativePlan]
        # (torch.Size, strides, dtype) → (plan, doubles it writes), for `summarise_keyed`
        self._keyed: dict[tuple[Any, ...], tuple[_NativePlan, int]]
        self.use_thumb(thumb)
        self._chunk: Any = None  # the arena's current chunk, its address, size and the doubles used in it
        self._addr = 0
        self._cap = 0
        self._used = 0
        # thumbnail cells given by `finalize` so far: a bound on what the step's traces hold, which
        # spares the thumbnail budget its walk over them when it is not reached (summary/budget.py)
        self.thumb_cells = 0
        self.nonfinite = False  # a summary `finalize` gave had a NaN or an Inf (the problem finder reads it)
        self._staged = StagedStats()  # device gradients' statistics, computed together (NOTE [Staged statistics])

    def use_thumb(self, thumb: int) -> None:
        """Thumbnails of at most `thumb`×`thumb` cells from the next summary on (the plans are per size)."""
        self.thumb = thumb
        if self.keep_values:  # (no plans are shared when values are kept)
            self._plans, self._tplans, self._keyed = {}, {}, {}
        else:
            self._plans = _native_plans.setdefault(thumb, {})
            self._tplans = _transposed_plans.setdefault(thumb, {})
            self._keyed = _keyed_plans.setdefault(thumb, {})

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
                return self.summarise_keyed(t, t.data_ptr(), (t.shape, t.stride(), t.dtype), stats_of)
        return self._summarise(t, stats_of)

    def fallback(self, t: torch.Tensor, stats_of: TensorTrace | None = None) -> TensorTrace:
        """A gradient the native recorder's kernel cannot summarise (NOTE [Native recorder] in
        tracer/record/native.py), from its hook, grad mode already off: summarised here as it would be
        anywhere else. `stats_of`: what arrived at a view node, shared as `summarise` shares it when its
        elements are as many (the Python recorder's hooks pass it on the same condition)."""
        if stats_of is not None and stats_of.numel != t.numel():
            stats_of = None
        return self._summarise(t, stats_of)

    def summarise_keyed(self, t: torch.Tensor, ptr: int, key: tuple[Any, ...],
                        stats_of: TensorTrace | None) -> TensorTrace:
        """`summarise_no_grad` for a strided `t` whose address `ptr` and `key` = (t.shape, t.stride(),
        t.dtype) the caller has read already (the node hooks read them for NOTE [Dedupe]): one dict
        lookup finds the kernel's plan for that exact layout, contiguous or a transposed matrix, and
        the kernel writes into the step's arena (NOTE [Summary arena])."""
        hit = self._keyed.get(key)
        if hit is None or not t.is_cpu:
            return self._first_of_layout(t, key, stats_of)
        plan, words = hit
        if stats_of is not None:  # NOTE [Views share a buffer]
            prev = self._fast.get(id(stats_of))
            if prev is not None and prev[0] is stats_of and prev[4] == ptr and _same_call(prev[3], plan):
                tr = TensorTrace(plan.shape, plan.dtype, {}, None, plan.view, None, "cpu")
                self._buffers.append((tr, prev[1], prev[2], plan))
                return tr
        used = self._used
        if used + words > self._cap:
            self._new_chunk(words)
            used = 0
        if plan.fn(ptr, plan.geom, self._addr + 8 * used):
            return self._summarise(t, stats_of)  # a float32 partial sum overflowed: torch recomputes
        self._used = used + words
        tr = TensorTrace(plan.shape, plan.dtype, {}, None, plan.view, None, "cpu")
        self._buffers.append((tr, self._chunk, used, plan))
        self._fast[id(tr)] = (tr, self._chunk, used, plan, ptr)
        return tr

    def _first_of_layout(self, t: torch.Tensor, key: tuple[Any, ...], stats_of: TensorTrace | None) -> TensorTrace:
        """A layout `summarise_keyed` has no plan for: the plan is looked up the long way (and remembered
        under `key` once it exists), or the tensor is summarised by `_summarise`."""
        if t.is_cpu and not self.keep_values:
            if t.is_contiguous():
                plan = self._plans.get((t.shape, t.dtype))
            else:
                plan = self._tplans.get((t.shape, t.dtype))
                if plan is not None and t.stride() != (1, plan.shape[0]):
                    plan = None
            if plan is not None:
                if len(self._keyed) >= _MAX_KEYED:
                    self._keyed.clear()
                self._keyed[key] = (plan, ctypes.sizeof(plan.buf_type) // 8)
                return self.summarise_keyed(t, t.data_ptr(), key, stats_of)
        return self._summarise(t, stats_of)

    def _new_chunk(self, words: int) -> None:
        """A fresh chunk of the arena, with room for at least `words` doubles: each chunk of a step
        twice the last, from `_FIRST_CHUNK` up to `_CHUNK_DOUBLES` (a small step zeroes little memory)."""
        self._cap = max(words, min(2 * self._cap, _CHUNK_DOUBLES) if self._chunk is not None else _FIRST_CHUNK)
        # a numpy buffer, not a ctypes array: `c_double * n` makes a new type for each size, which is
        # freed as cyclic garbage (tests/test_side_effects.py)
        self._chunk = np.zeros(self._cap, np.float64)
        self._addr = self._chunk.ctypes.data
        self._used = 0

    def _summarise(self, t: torch.Tensor, stats_of: TensorTrace | None) -> TensorTrace:
        if t.layout is not _STRIDED:
            return self._summarise_sparse(t)
        shape = tuple(t.shape)
        dt, dev = t.dtype, t.device
        words = _words.get((dt, dev))
        if words is None:
            words = _words[(dt, dev)] = (dtype_name(dt), str(dev))
        tr = TensorTrace(shape, words[0], {}, None, "", None, words[1])  # thumb_view: at finalize
        if stats_of is None and not self.keep_values and t.numel() == 0:
            # an empty gradient (a `torch.cat` with an empty cache tensor, in transformers' attention): what the
            # general path makes of it, without its torch and numpy calls (four a Llama step cost 0.15 ms at finalize)
            tr.stats, tr.thumb_view = dict(_EMPTY_STATS), _view_of(shape)
            tr.thumb = np.zeros((0, 0), dtype=np.float32) if self.thumb > 0 else None
            return tr
        fast = native_summary(t, self.thumb)
        if fast is not None:  # a shape's first call (it makes the fast path's plan), or values kept
            self._pending.append(PendingSummary(tr, fast[0], fast[1], self._values(t), None, False))
            return tr
        th = thumbnail(t, self.thumb) if self.thumb > 0 else None
        # A small tensor costs more in op dispatch than in memory passes (NOTE [Summary cost] in stats.py); its
        # thumbnail is an exact copy, so its statistics are computed on the host at finalize.
        host = stats_of is None and th is not None and t.dtype != torch.float64 and fits_whole(shape, self.thumb)
        p = PendingSummary(tr, None, th, self._values(t), stats_of, host)
        if stats_of is None and not host and not self._staged.add(t, p):
            p.raw = raw_stats(t)
        self._pending.append(p)
        return tr

    def _summarise_sparse(self, t: torch.Tensor) -> TensorTrace:
        """A sparse gradient (nn.Embedding(sparse=True), a sparse matmul): see NOTE [Sparse gradients]."""
        tr = TensorTrace(tuple(t.shape), dtype_name(t.dtype), {}, None, "", None, str(t.device))
        coo = as_coalesced_coo(t)
        if coo is None:
            tr.thumb_view = f"not summarised: {str(t.layout).replace('torch.', '')} layout"
            return tr
        vals = _compat.sparse_values(coo)
        raw = with_implicit_zeros(raw_stats(vals), t.numel() - vals.numel())
        th, view = sparse_thumbnail(coo, self.thumb) if self.thumb > 0 else (None, None)
        values = None
        if self.keep_values and t.numel() <= _MAX_DENSE_VALUES:
            values = self._values(coo.to_dense())
        self._pending.append(PendingSummary(tr, raw, th, values, None, False, view))
        return tr

    def _values(self, t: torch.Tensor) -> torch.Tensor | None:
        if not self.keep_values:
            return None
        v = t.detach()
        return (v.float() if v.dtype in (torch.bfloat16, torch.float16) else v).clone()

    def _read_buffers(self, buffers: list[Any]) -> None:
        """The fast path's kernel results: each trace's statistics, and its thumbnail as the native recorder's
        arena keeps it (NOTE [Arena thumbnails])."""
        cells, bad = 0, 0.0
        for tr, chunk, off, plan in buffers:
            raw = _unpack_stats(chunk, 8 * off)
            bad += raw[5] + raw[6]  # NaN and Inf counts
            tr.stats = stats_from_raw(raw)
            if plan.th_shape is not None:
                th = np.ndarray(plan.th_shape, _F32, chunk, 8 * off + 64)  # the kernel's float32 cells
                tr.thumb = bfloat16.rounded(th.T if plan.transposed else th)
                cells += th.size
        self.thumb_cells += cells
        if bad:
            self.nonfinite = True

    def finalize(self) -> None:
        """Bring every pending summary to the host: CPU results are used in place; for each other
        device, one stacked transfer for the statistics and one for the thumbnails. Values (full
        mode only) are copied one by one."""
        self._staged.reduce_all()
        buffers, self._buffers = self._buffers, []
        self._fast = {}
        self._chunk, self._cap, self._used = None, 0, 0  # later summaries go to chunks of their own
        self._read_buffers(buffers)
        pending, self._pending = self._pending, []
        remote: dict[torch.device, list[PendingSummary]] = {}
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
            if p.trace.thumb is not None:
                if p.trace.device == "cpu":  # as the native recorder's arena keeps it (NOTE [Arena thumbnails]),
                    p.trace.thumb = bfloat16.rounded(p.trace.thumb)  # after the statistics read from it
                self.thumb_cells += p.trace.thumb.size
            if p.trace.stats.get("nan") or p.trace.stats.get("inf"):
                self.nonfinite = True


def _view_of(shape: tuple[int, ...]) -> str:
    view = _views.get(shape)
    if view is None:
        if len(_views) > 4096:  # shapes that keep changing (variable sequence lengths)
            _views.clear()
        view = _views[shape] = thumbnail_view(shape)
    return view
