"""A recorded step as flat tables (the native recorder's, the Python recorder's laid out the same way, or one
read back from columns), and the `NodeTrace`s made from them on demand.

NOTE [Step tables]
    The native recorder (NOTE [Native recorder] in tracer/record/native.py) leaves a step as arrays: the graph (names,
    kinds, edges, the shapes of each node's outputs), one record per node run, the summary of each gradient slot, the
    kernel's statistics and thumbnails in its arena. Making a `NodeTrace`, its `NodeRun`s and `TensorTrace`s for every
    node when the step ends cost more than the whole native recording, and each of those objects is one more for the
    cyclic garbage collector to scan for as long as the step is kept. So `StepTrace.nodes` is a `LazyNodes`: a
    sequence whose items are made when read, once, from the tables (and kept); a `TensorTrace` is made once per
    summary, so two slots that share a gradient share the object, as the Python recorder's do. Readers that go over
    every node for one fact (the column writer wire_columns.py, the problem finder, the thumbnail budget) read the
    columns instead (`TensorTable.raw`, `LazyNodes.name_of`, `LazyNodes.ids_named`). The Python recorder's steps and
    steps read back from a trace file are the same tables, with every summary Python's (NOTE [Python steps as tables]
    in assemble.py, NOTE [Read back as tables] in column_tables.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast, overload

import numpy as np

from gradscape.tracer._model import NodeRun, NodeTrace, TensorTrace
from gradscape.tracer.collector import collector_paused
from gradscape.tracer.record.labels import RELU_LIKE
from gradscape.tracer.record.tensor_table import TensorTable

# one row per node run, in the order they ran: its node, pass, time (NaN: none), and where its `go` and `gi` are
# in the step's slots (`gi_n` -1: no `gi`); a slot is a row of the tensor table, -1 for none
RUN_DTYPE = np.dtype([("node", "<i4"), ("pass", "<i4"), ("time", "<f8"), ("go_off", "<i4"), ("go_n", "<i4"),
                      ("gi_off", "<i4"), ("gi_n", "<i4")])
_ACC_SEQ = (1 << 64) - 1  # the sequence number of every AccumulateGrad node (it has no source line)


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


class Outputs:
    """Shapes and dtype names of each node's forward outputs, as columns (`off`: each node's first output, one
    more than the nodes; per output `ndim`, -1 for no shape, `dtype`, a code into `names`, -1 for none; `dims`,
    every shape's sizes one after the other), and made into lists once per node when asked (`(shapes,
    dtypes)`). `Outputs.lazy` makes the columns only when first read (most steps' nodes never are)."""

    _COLUMNS = ("off", "ndim", "dtype", "dims")

    def __init__(self, off: np.ndarray, ndim: np.ndarray, dtype: np.ndarray, dims: np.ndarray,
                 names: dict[int, str]) -> None:
        self.off, self.ndim, self.dtype, self.dims, self.names = off, ndim, dtype, dims, names
        self._made: dict[int, tuple[list[Any], list[str | None]]] = {}
        self._lists: tuple[list[int], ...] | None = None  # the columns as lists, once a node is asked for
        self._load: Callable[[], tuple[np.ndarray, ...]] | None = None

    @classmethod
    def lazy(cls, load: Callable[[], tuple[np.ndarray, ...]], names: dict[int, str]) -> Outputs:
        """The columns (`off`, `ndim`, `dtype`, `dims`) as `load()` gives them, called when one is first read."""
        out = cls.__new__(cls)
        out.names, out._made, out._lists, out._load = names, {}, None, load
        return out

    def __getattr__(self, attr: str) -> Any:
        load = self.__dict__.get("_load")
        if attr not in Outputs._COLUMNS or load is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")
        self.off, self.ndim, self.dtype, self.dims = load()
        return self.__dict__[attr]

    def __call__(self, k: int) -> tuple[list[Any], list[str | None]]:
        made = self._made.get(k)
        if made is None:
            if self._lists is None:
                starts = np.concatenate([[0], np.cumsum(np.maximum(self.ndim, 0).astype(np.int64))])
                self._lists = tuple(a.tolist() for a in (self.off, self.ndim, starts, self.dims, self.dtype))
            off, ndim, dim_off, dims, dtype = self._lists
            names = self.names
            shapes: list[Any] = []
            dtypes: list[str | None] = []
            for o in range(off[k], off[k + 1]):
                nd = ndim[o]
                shapes.append(None if nd < 0 else tuple(dims[dim_off[o]:dim_off[o] + nd]))
                dtypes.append(names.get(dtype[o]))
            made = self._made[k] = (shapes, dtypes)
        return made


class StepTables:
    """What `LazyNodes` makes `NodeTrace`s from: per node its name, kind, module, parameter, source line,
    statics (labels, slot arguments, schema), output shapes and dtypes, and its runs."""

    def __init__(self, names: list[str], name_code: np.ndarray, kinds: list[str], modules: list[str | None],
                 params: dict[int, str], sources: list[str | None], statics: list[Any], outputs: Outputs,
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

    def first_relu_slots(self) -> list[tuple[int, int, int]]:
        """`relu_slots` read from the tables (the native recorder's extension finds them as it records)."""
        out = []
        relu = [i for i, nm in enumerate(self.names) if nm in RELU_LIKE]
        for k in np.flatnonzero(np.isin(self.name_code, relu)).tolist() if relu else ():
            rows = self.node_runs(k)
            if len(rows):
                r = self.runs[int(rows[0])]
                if r["gi_n"] > 0 and r["go_n"] > 0:
                    sent, came = int(self.slots[int(r["gi_off"])]), int(self.slots[int(r["go_off"])])
                    if sent >= 0 and came >= 0:
                        out.append((k, sent, came))
        return out

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
        """Every node, those not made yet made at once with the collector paused: made one by one as a loop
        asked for them, the collector ran over the whole step again and again (20k nodes read back: 0.49 s,
        0.12 s paused; NOTE [Collector paused] in tracer/collector.py)."""
        made = self._made
        if None in made:
            with collector_paused():
                for k, n in enumerate(made):
                    if n is None:
                        made[k] = self._make(k)
        return iter(cast("list[NodeTrace]", made))

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

    def column_parts(self, st: Any) -> Any:
        """The step as columns (NOTE [Column document] in tracer/wire/columns.py), or None: what
        `tracer.wire.column_write` asks of a natively recorded step for the store and the sinks."""
        from gradscape.tracer.record.wire_columns import column_parts

        return column_parts(st)

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
