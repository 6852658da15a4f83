"""A step recorded by the native recorder, as flat tables, and the `NodeTrace`s made from them on demand.

NOTE [Step tables]
    The native recorder (NOTE [Native recorder] in tracer/record/native.py) leaves a step as arrays:
    the graph (names, kinds, edges, the shapes of each node's outputs), one record per node run, the
    summary of each gradient slot, the kernel's statistics and thumbnails in its arena. Making a
    `NodeTrace`, its `NodeRun`s and `TensorTrace`s for every node when the step ends cost more than the
    whole native recording, and each of those objects is one more for the cyclic garbage collector to
    scan for as long as the step is kept. So `StepTrace.nodes` is a `LazyNodes`: a sequence whose items
    are made when read, once, from the tables (and kept); a `TensorTrace` is made once per summary,
    so two slots that share a gradient share the object, as the Python recorder's do. Readers that go
    over every node for one fact (the wire codec, the problem finder, the thumbnail budget) read the
    columns instead (`TensorTable.raw`, `LazyNodes.names`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from gradscape.tracer._model import NodeRun, NodeTrace, TensorTrace
from gradscape.tracer.record.arena_compact import compact
from gradscape.tracer.summary import bfloat16
from gradscape.tracer.summary.fastpath import KERNEL_PLANS
from gradscape.tracer.summary.stats import stats_from_raw

_F32 = np.dtype(np.float32)
_ACC_SEQ = (1 << 64) - 1  # the sequence number of every AccumulateGrad node (it has no source line)


class TensorTable:
    """Every summary of a step the native recorder made: the kernel's (statistics and thumbnail in the
    arena, read when the `TensorTrace` is made) and Python's (`py`, complete `TensorTrace`s)."""

    def __init__(self, summs: np.ndarray, chunks: list[Any], py: list[TensorTrace], raw: np.ndarray,
                 kernel_nonfinite: bool, evicted_cells: int = 0) -> None:
        self.plan = summs["plan"]
        self.chunk = summs["chunk"]
        self.off = summs["off"]
        self.py_index = summs["py"]
        # bit 0: float32 thumbnail cells, at bfloat16's precision (NOTE [Arena thumbnails]); bit 1: left out by the
        # budget while recording (NOTE [Budget while recording] in csrc/budget.h), no cells in the arena: the budget
        # at the step's end leaves them out again (`no_thumb`), counted as it counts the others
        self.flags = summs["wide"]
        self._evicted_cells = evicted_cells
        self.chunks = [np.frombuffer(c, np.float64) for c in chunks]
        self.py = py
        n = len(summs)
        self.raw = raw  # the kernel's 8 raw statistics of each summary (`stats_from_raw`), NaN for Python's
        self._kernel_nonfinite = kernel_nonfinite  # a kernel summary counted a NaN or an Inf (the extension's `tables`)
        # an upper bound on the thumbnail cells of the kernel's summaries: a cell is at least a bfloat16 of the arena,
        # and the pictures left out while recording count as they will at the step's end
        self.cells_bound = sum(map(len, chunks)) // 2 + evicted_cells
        self.no_thumb = np.zeros(n, bool)  # left out by the thumbnail budget
        self._made: list[TensorTrace | None] = [None] * n

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
        """Each summary's L2 norm (-1 for NaN), as `stats["norm"]` gives it."""
        out = np.sqrt(np.maximum(self.raw[:, 3], 0.0))
        out[self.raw[:, 7] <= 0] = 0.0
        for k in np.nonzero(self.plan < 0)[0]:
            out[k] = self.py[int(self.py_index[k])].stats.get("norm", math.nan)
        return np.where(np.isnan(out), -1.0, out)

    def flagged(self) -> np.ndarray:
        """Each summary counted a NaN or an Inf."""
        out = self.raw[:, 5] + self.raw[:, 6] > 0
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


_NAME_MASKS: dict[tuple[int, frozenset[str]], tuple[list[str], np.ndarray]] = {}


def _name_mask(names: list[str], wanted: frozenset[str]) -> np.ndarray:
    """By name code (`names`, the extension's list), whether the name is one of `wanted`; made once per list."""
    hit = _NAME_MASKS.get((id(names), wanted))
    if hit is not None and hit[0] is names:
        return hit[1]
    if len(_NAME_MASKS) >= 16:
        _NAME_MASKS.clear()
    mask = np.array([nm in wanted for nm in names], bool)
    _NAME_MASKS[(id(names), wanted)] = (names, mask)
    return mask


def _max0(x: np.ndarray) -> np.ndarray:
    """Python's `max(x, 0.0)` elementwise: x itself unless x < 0.0 (so NaN and -0.0 stay as they are)."""
    return np.where(x < 0.0, 0.0, x)


class StepTables:
    """What `LazyNodes` makes `NodeTrace`s from: per node its name, kind, module, parameter, source line,
    statics (labels, slot arguments, schema), output shapes and dtypes, and its runs."""

    def __init__(self, names: list[str], name_code: np.ndarray, kinds: list[str], modules: list[str | None],
                 params: dict[int, str], sources: list[str | None], statics: list[Any], outputs: Any,
                 child_off: np.ndarray, child_id: np.ndarray, child_nr: np.ndarray, runs: np.ndarray,
                 slots: np.ndarray, tensors: TensorTable, by_node: tuple[np.ndarray, np.ndarray]) -> None:
        self.names, self.name_code, self.kinds, self.modules = names, name_code, kinds, modules
        self.params, self.sources, self.statics, self.outputs = params, sources, statics, outputs
        self.child_off, self.child_id, self.child_nr = child_off, child_id, child_nr
        self.runs, self.slots, self.tensors = runs, slots, tensors
        # each node's runs, in the order they ran (a run's order is its position in `runs`): `run_rows`, the runs'
        # positions by node; `run_start`, where each node's begin in it (one more than the nodes)
        self.run_rows, self.run_start = by_node
        self._lists: _Lists | None = None
        # (node, sent row, came row) of every ReLU-like node that ran (`labels.RELU_LIKE`), in id order: the tensor
        # rows of its first run's grad_inputs[0] and grad_outputs[0] (the dead-unit check's), when it has both
        self.relu_slots: list[tuple[int, int, int]] = []

    def lists(self) -> _Lists:
        """The columns `LazyNodes` reads node by node, as Python lists (made once, when first asked)."""
        if self._lists is None:
            self._lists = _Lists(self)
        return self._lists

    def node_runs(self, nid: int) -> np.ndarray:
        """Positions in `runs` (= execution order) of node `nid`'s runs."""
        return self.run_rows[self.run_start[nid]:self.run_start[nid + 1]]

    def slot_traces(self, off: int, n: int) -> list[TensorTrace | None]:
        get = self.tensors.get
        slots = self.slots[off:off + n].tolist() if self._lists is None else self._lists.slots[off:off + n]
        return [None if s < 0 else get(s) for s in slots]


class _Lists:
    """`StepTables`' columns as lists: a numpy array read one element at a time costs a scalar object a
    read, and making every `NodeTrace` of a 100k-node step read 2.5 million of them."""

    __slots__ = ("child_off", "child_id", "child_nr", "run_rows", "run_start", "slots", "pass_", "time", "go_off",
                 "go_n", "gi_off", "gi_n")

    def __init__(self, t: StepTables) -> None:
        self.child_off, self.child_id, self.child_nr = t.child_off.tolist(), t.child_id.tolist(), t.child_nr.tolist()
        self.run_rows, self.run_start, self.slots = t.run_rows.tolist(), t.run_start.tolist(), t.slots.tolist()
        r = t.runs
        self.pass_, self.time = r["pass"].tolist(), r["time"].tolist()
        self.go_off, self.go_n, self.gi_off, self.gi_n = (r[f].tolist() for f in ("go_off", "go_n", "gi_off", "gi_n"))


class LazyNodes(Sequence[NodeTrace]):
    """`StepTrace.nodes` of a natively recorded step: each `NodeTrace` made when first read (NOTE [Step
    tables])."""

    def __init__(self, tables: StepTables) -> None:
        self.tables = tables
        self._made: list[NodeTrace | None] = [None] * len(tables.name_code)

    def __len__(self) -> int:
        return len(self._made)

    @overload
    def __getitem__(self, i: int) -> NodeTrace: ...

    @overload
    def __getitem__(self, i: slice) -> list[NodeTrace]: ...

    def __getitem__(self, i: int | slice) -> NodeTrace | list[NodeTrace]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self._made)))]
        n = self._made[i]
        if n is None:
            k = i if i >= 0 else i + len(self._made)
            if not 0 <= k < len(self._made):
                raise IndexError(f"node {i} out of range")
            n = self._made[k] = self._make(k)
        return n

    def __iter__(self) -> Iterator[NodeTrace]:
        for k in range(len(self._made)):
            yield self[k]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"LazyNodes({len(self)} nodes)"

    # ---- columns, for readers that go over every node for one fact
    def name_of(self, k: int) -> str:
        t = self.tables
        return t.names[int(t.name_code[k])]

    def ids_named(self, names: set[str] | frozenset[str]) -> list[int]:
        t = self.tables
        wanted = _name_mask(t.names, frozenset(names))
        return np.flatnonzero(wanted[t.name_code]).tolist() if wanted.any() else []

    def param_ids(self) -> dict[str, int]:
        """Parameter name → the id of its AccumulateGrad node (the first, as `StepTrace.param_node`)."""
        out: dict[str, int] = {}
        for nid, p in sorted(self.tables.params.items()):
            out.setdefault(p, nid)
        return out

    def module_names(self) -> set[str]:
        return {m for m in self.tables.modules if m}

    def wire_nodes(self, tab: Any) -> list[Any]:
        """Every node's wire form, from the tables (NOTE [Nodes to the wire] in tracer/record/wire_nodes.py);
        `tab` is the codec's tensor table."""
        from gradscape.tracer.record.wire_nodes import wire_nodes

        return wire_nodes(self, tab)

    # ---- one node
    def _make(self, k: int) -> NodeTrace:
        t = self.tables
        c = t.lists()
        st = t.statics[k]
        a, b = c.child_off[k], c.child_off[k + 1]
        outputs = t.outputs
        out_shapes, out_dtypes = outputs(k)
        in_shapes: list[Any] = []
        for child, nr in zip(c.child_id[a:b], c.child_nr[a:b]):
            if child < 0:
                in_shapes.append(None)
            else:
                shapes = outputs(child)[0]
                in_shapes.append(shapes[nr] if nr < len(shapes) else None)
        runs: list[NodeRun] = []
        traces = t.slot_traces
        for pos in c.run_rows[c.run_start[k]:c.run_start[k + 1]]:
            go = traces(c.go_off[pos], c.go_n[pos])
            gi_n = c.gi_n[pos]
            gi = None if gi_n < 0 else traces(c.gi_off[pos], gi_n)
            time_us = c.time[pos]
            runs.append(NodeRun(c.pass_[pos], pos, go, gi, None if time_us != time_us else time_us))
        # an unchanged list is the one the previous step's trace holds (StructureCache)
        if in_shapes != st.input_shapes:
            st.input_shapes = in_shapes
        if out_shapes != st.output_shapes:
            st.output_shapes = list(out_shapes)
        if out_dtypes != st.output_dtypes:
            st.output_dtypes = list(out_dtypes)
        first = runs[0] if runs else None
        return NodeTrace(k, t.names[int(t.name_code[k])], t.kinds[k], t.modules[k], t.params.get(k), t.sources[k],
                         st.schema, None if first is None else first.order, st.labels, st.args, st.input_shapes,
                         st.output_shapes, st.output_dtypes, None if first is None else first.grad_inputs,
                         None if first is None else first.grad_outputs, None if first is None else first.time_us,
                         runs)


def grads_of(nodes: Sequence[NodeTrace], k: int, sent: bool) -> list[TensorTrace | None] | None:
    """Node `k`'s `grad_inputs` (`sent`) or `grad_outputs`, without making its `NodeTrace` when `nodes` is
    a `LazyNodes` that has not made it yet."""
    if isinstance(nodes, LazyNodes) and nodes._made[k] is None:
        t = nodes.tables
        rows = t.node_runs(k)
        if not len(rows):
            return None
        r = t.runs[int(rows[0])]
        if sent:
            return None if r["gi_n"] < 0 else t.slot_traces(int(r["gi_off"]), int(r["gi_n"]))
        return t.slot_traces(int(r["go_off"]), int(r["go_n"]))
    n = nodes[k]
    return n.grad_inputs if sent else n.grad_outputs


def ids_named(nodes: Sequence[NodeTrace], names: set[str] | frozenset[str]) -> list[int]:
    """The ids of the nodes whose name is one of `names` (from the name column of a `LazyNodes`)."""
    if isinstance(nodes, LazyNodes):
        return nodes.ids_named(names)
    return [n.id for n in nodes if n.name in names]
