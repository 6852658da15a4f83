"""Every gradient summary of a natively recorded step (`TensorTable`): the kernel's statistics and its thumbnail in
the step's arena, read when a `TensorTrace` is made, and Python's summaries (NOTE [Step tables] in tables.py)."""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

import numpy as np

from gradscape.tracer._model import TensorTrace
from gradscape.tracer.record.arena_compact import compact
from gradscape.tracer.summary import bfloat16
from gradscape.tracer.summary.budget import raw_flagged, raw_norms
from gradscape.tracer.summary.fastpath import KERNEL_PLANS
from gradscape.tracer.summary.stats import stats_from_raw

_F32 = np.dtype(np.float32)
# one row per summary: its kernel plan (-1: Python's), where its statistics and thumbnail are in the arena
# (`chunk`, `off`), its place among Python's (`py`) and its flags (`wide`: `TensorTable.flags`)
SUMM_DTYPE = np.dtype([("plan", "<i4"), ("chunk", "<i4"), ("off", "<i8"), ("py", "<i4"), ("wide", "<i4")])


class TensorTable:
    """Every summary of a step the native recorder made: the kernel's (statistics and thumbnail in the
    arena, read when the `TensorTrace` is made) and Python's (`py`, complete `TensorTrace`s)."""

    def __init__(self, summs: np.ndarray, chunks: list[Any], py: list[TensorTrace], raw: np.ndarray,
                 kernel_nonfinite: bool, evicted_cells: int = 0) -> None:
        self.plan = summs["plan"]
        # the other columns, the arena's chunks as arrays and `no_thumb` are made when first read (each numpy call
        # costs a small step's end a few µs, and most steps kept in memory read none of them)
        self._summs = summs
        self._chunk_bytes = chunks
        self._evicted_cells = evicted_cells
        self.py = py
        n = len(summs)
        self.raw = raw  # the kernel's 8 raw statistics of each summary (`stats_from_raw`), NaN for Python's
        self._kernel_nonfinite = kernel_nonfinite  # a kernel summary counted a NaN or an Inf (the extension's `tables`)
        # an upper bound on the thumbnail cells of the kernel's summaries: a cell is at least a bfloat16 of the arena,
        # and the pictures left out while recording count as they will at the step's end
        self.cells_bound = sum(map(len, chunks)) // 2 + evicted_cells
        self._made: list[TensorTrace | None] = [None] * n

    @cached_property
    def chunk(self) -> np.ndarray:
        """Per summary, the arena chunk of its statistics and thumbnail."""
        return self._summs["chunk"]

    @cached_property
    def off(self) -> np.ndarray:
        """Per summary, where its statistics start in its chunk (in doubles)."""
        return self._summs["off"]

    @cached_property
    def py_index(self) -> np.ndarray:
        """Per summary that Python made (plan -1), its place among Python's (`py`)."""
        return self._summs["py"]

    @cached_property
    def flags(self) -> np.ndarray:
        """Per summary, bit 0: float32 thumbnail cells, at bfloat16's precision (NOTE [Arena thumbnails]); bit 1: left
        out by the budget while recording (NOTE [Budget while recording] in csrc/budget.h), no cells in the arena: the
        budget at the step's end leaves them out again (`no_thumb`), counted as it counts the others."""
        return self._summs["wide"]

    @cached_property
    def chunks(self) -> list[np.ndarray]:
        """The arena's chunks, as arrays of doubles (`arena_compact` may replace them, freeing the bytes: the table
        keeps them only through these)."""
        out = [np.frombuffer(c, np.float64) for c in self._chunk_bytes]
        self._chunk_bytes = []
        return out

    @cached_property
    def no_thumb(self) -> np.ndarray:
        """Per summary, left out by the thumbnail budget."""
        return np.zeros(len(self._made), bool)

    @classmethod
    def of_traces(cls, traces: list[TensorTrace]) -> TensorTable:
        """A table whose every summary is Python's: `traces`, in order (a Python-recorded step's, one read
        back: NOTE [Python steps as tables] in assemble.py)."""
        n = len(traces)
        summs = np.zeros(n, SUMM_DTYPE)
        summs["plan"] = -1
        summs["py"] = np.arange(n)
        return cls(summs, [], traces, np.full((n, 8), np.nan), False)

    def __len__(self) -> int:
        return len(self._made)

    def get(self, k: int) -> TensorTrace:
        """The `TensorTrace` of summary `k` (made once)."""
        tr = self._made[k]
        if tr is None:
            tr = self._made[k] = self._make(k)
        return tr

    def _make(self, k: int) -> TensorTrace:
        p = int(self.plan[k])
        if p < 0:
            return self.py[int(self.py_index[k])]
        plan = KERNEL_PLANS[p]
        return TensorTrace(plan.shape, plan.dtype, stats_from_raw(tuple(self.raw[k].tolist())), self.thumb_of(k),
                           plan.view, None, "cpu")

    def thumb_of(self, k: int) -> np.ndarray | None:
        """The thumbnail of kernel summary `k` (plan >= 0), None when it has none or the budget left it out."""
        plan = KERNEL_PLANS[int(self.plan[k])]
        flags = int(self.flags[k])
        if plan.th_shape is None or self.no_thumb[k] or flags & 2:
            return None
        arr, at = self.chunks[int(self.chunk[k])], 8 * (int(self.off[k]) + 8)
        if flags & 1:  # float32 cells, at bfloat16's precision already: a view of the arena
            th = np.ndarray(plan.th_shape, _F32, arr, at)
        else:
            th = bfloat16.widen_one(np.ndarray(plan.th_shape, np.uint16, arr, at))
        return np.ascontiguousarray(th.T) if plan.transposed else th

    @property
    def wide(self) -> np.ndarray:
        """Per summary, 1 where its thumbnail's cells are float32."""
        return self.flags & 1

    @property
    def evicted(self) -> np.ndarray:
        """Per summary, whether the budget left its picture out while recording."""
        if not self._evicted_cells:
            return np.zeros(len(self.flags), bool)
        return (self.flags & 2) != 0

    def arena_bytes(self) -> int:
        """The bytes of the arena the kernel's summaries use (to the last row's statistics; its thumbnail
        is not counted), read from the offsets alone."""
        ok = self.plan >= 0
        if not ok.any():
            return 0
        ends = np.zeros(len(self.chunks), np.int64)
        np.maximum.at(ends, self.chunk[ok], self.off[ok].astype(np.int64) + 8)
        return 8 * int(ends.sum())

    def zeros_of(self, k: int) -> tuple[float, int]:
        """Summary `k`'s `stats["zeros"]` and `numel`, without making its `TensorTrace`."""
        p = int(self.plan[k])
        made = self._made[k]
        if p < 0 or made is not None:
            t = self.get(k) if made is None else made
            return t.stats.get("zeros", 0.0), t.numel
        _mn, _mx, _s, _ss, nz, _nan, _inf, n = self.raw[k].tolist()
        return (0.0 if n <= 0 else n - nz), math.prod(KERNEL_PLANS[p].shape)

    def norms_of(self, rows: list[int]) -> dict[int, tuple[float, bool]]:
        """Each summary of `rows` the kernel made: its norm and whether it counted a NaN or an Inf, without making
        its `TensorTrace` (one made by Python is left out: `get` has it)."""
        kernel = [k for k in rows if int(self.plan[k]) >= 0]
        if not kernel:
            return {}
        raw = self.raw[kernel]
        return dict(zip(kernel, zip(raw_norms(raw).tolist(), raw_flagged(raw).tolist())))

    def stats_rows(self) -> list[list[float]]:
        """`stats_array` as lists."""
        return self.stats_array().tolist()

    def stats_array(self) -> np.ndarray:
        """Every summary's statistics in `STAT_NAMES` order, as `stats_from_raw` makes them one at a time (the
        same float operations, on all the kernel's rows at once; rows of Python's summaries are NaN)."""
        mn, mx, s, ss, nz, nan, inf, n = self.raw.T
        some = n > 0
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            mean = s / np.where(some, n, 1.0)
            std = np.sqrt(_max0(ss - s * mean) / np.where(n - 1.0 < 1.0, 1.0, n - 1.0))
            norm = np.sqrt(_max0(ss))
        out = np.stack([mn, mx, mean, std, norm, nan, inf, n - nz], axis=1)
        out[~some, :4] = np.nan
        out[~some, 4] = 0.0
        out[~some, 7] = 0.0
        return out

    def nonfinite(self) -> bool:
        """True when a summary counted a NaN or an Inf."""
        if self._kernel_nonfinite:
            return True
        return any(t.stats.get("nan") or t.stats.get("inf") for t in self.py)

    def thumb_cells(self) -> np.ndarray:
        """Cells of each summary's thumbnail (0 for none)."""
        cells = np.where(self.no_thumb, 0, _plan_cells()[self.plan])
        for k in np.nonzero(self.plan < 0)[0]:
            t = self.py[int(self.py_index[k])]
            cells[k] = 0 if t.thumb is None else t.thumb.size
        return cells

    def norms(self) -> np.ndarray:
        """Each summary's L2 norm, as `stats["norm"]` gives it (NaN for a NaN)."""
        out = raw_norms(self.raw)
        for k in np.nonzero(self.plan < 0)[0]:
            out[k] = self.py[int(self.py_index[k])].stats.get("norm", math.nan)
        return out

    def flagged(self) -> np.ndarray:
        """Each summary counted a NaN or an Inf."""
        out = raw_flagged(self.raw)
        for k in np.nonzero(self.plan < 0)[0]:
            st = self.py[int(self.py_index[k])].stats
            out[k] = bool(st.get("nan") or st.get("inf"))
        return out

    def held(self) -> set[int]:
        """The ids of the `TensorTrace`s made from this table so far (Python's summaries included)."""
        return {id(t) for t in self._made if t is not None} | {id(t) for t in self.py}

    def drop_thumbs(self, ks: np.ndarray) -> None:
        """The thumbnail budget leaves the thumbnails of summaries `ks` out."""
        self.no_thumb[ks] = True
        made, py, py_index = self._made, self.py, self.py_index
        for k in ks[self.plan[ks] < 0].tolist():
            py[int(py_index[k])].thumb = None
        for k in ks[self.plan[ks] >= 0].tolist():
            if (t := made[k]) is not None:
                t.thumb = None
        compact(self, _plan_cells()[self.plan])  # NOTE [Arena compaction]: their cells are freed

    def made(self) -> list[TensorTrace]:
        """The `TensorTrace`s made from this table so far."""
        return [t for t in self._made if t is not None]


_PLAN_CELLS = np.zeros(1, np.int64)  # `_plan_cells`


def _plan_cells() -> np.ndarray:
    """Thumbnail cells of each kernel plan's summaries, by plan id; the last entry, for summaries made in
    Python (plan -1), is 0. `KERNEL_PLANS` only grows: remade when it has."""
    global _PLAN_CELLS
    if len(_PLAN_CELLS) != len(KERNEL_PLANS) + 1:
        _PLAN_CELLS = np.array([0 if p.th_shape is None else p.th_shape[0] * p.th_shape[1] for p in KERNEL_PLANS]
                               + [0], np.int64)
    return _PLAN_CELLS


def _max0(x: np.ndarray) -> np.ndarray:
    """Python's `max(x, 0.0)` elementwise: x itself unless x < 0.0 (so NaN and -0.0 stay as they are)."""
    return np.where(x < 0.0, 0.0, x)
