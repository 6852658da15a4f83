"""One step recorded by the native recorder (NOTE [Native recorder] in native.py): each backward pass's
start and end, and at the end the step's nodes (`LazyNodes`: each `NodeTrace` made when read), edges
and execution order (`LazyTuples`) from its tables (NOTE [Step tables] in tables.py)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from gradscape.tracer import _compat
from gradscape.tracer._model import BackwardPass
from gradscape.tracer.record.lazy_traces import TableList
from gradscape.tracer.record.lazy_tuples import LazyTuples
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.record.native import KINDS, NativeGraph, arrays_of, dtype_names, names, relu_codes
from gradscape.tracer.record.structure import ArrayGraph, NodeStatics, StructureCache, grouped_statics
from gradscape.tracer.record.tables import RUN_DTYPE, LazyNodes, Outputs, StepTables
from gradscape.tracer.record.tensor_table import SUMM_DTYPE, TensorTable
from gradscape.tracer.record.walk import NodeRecord
from gradscape.tracer.summary.summariser import Summariser

_OUTPUTS = ("out_off", "out_ndim", "out_dtype", "out_dims")
# `end_pass`: ([(node, run, grad, arrived, version, variable)], node → parameter name)
Arrivals = tuple[list[tuple[int, int, Any, bool, int, torch.Tensor]], dict[int, str]]


class NativeStep:
    """The native recorder's part of one traced step: `graph` (the walk, the hooks, the records)."""

    def __init__(self, model: ModelIndex, summariser: Summariser, thumb: int) -> None:
        self.graph = NativeGraph(model, summariser, thumb)
        self.model = model
        self.summ = summariser
        self.pass_runs: list[int] = []  # runs recorded before each pass began
        self.tables: StepTables | None = None
        # (pass index, root node id, output nr) of every root, resolved into `BackwardPass.root_grads` at the end
        self._roots: list[tuple[BackwardPass, int, int]] = []

    # ---- a backward pass
    def start_pass(self, roots: list[tuple[Any, int]], seq0: int) -> list[int]:
        """Walk the graph from each root (a (grad_fn, output nr)) and hook the new nodes; the roots' ids (`seq0`: the
        creation counter as the step began, for the call's key: `NativeGraph.start_call`)."""
        return self.graph.start_call(roots, seq0)

    def begin(self, bp: BackwardPass) -> None:
        """Pass `bp` starts now (the time of its first node is counted from here)."""
        bp.start = int(self.graph.rec.begin_pass(bp.index))
        self.pass_runs.append(bp.start)

    def end_pass(self, bp: BackwardPass, roots: list[tuple[Any, int]]) -> Arrivals:
        """Note the pass's roots (their gradients are read at the end); returns what arrived at each parameter, in one
        extension call (NOTE [A backward call's ends in one call] in csrc/backward_call.h): for each AccumulateGrad node
        that ran, (its id, the run of the last arrival at it, its variable's `.grad` as the pass ended, whether that is
        what arrived, its version, the variable), with the graph's node → parameter name, for
        `ParamGradients.after_pass`, which holds none of the tensors."""
        for (_node, nr), rid in zip(roots, bp.roots):
            self._roots.append((bp, rid, nr))
        end, entries = self.graph.rec.end_call(self.pass_runs[-1] if self.pass_runs else 0)
        bp.end = end
        return entries, self.graph.params

    def records(self) -> list[NodeRecord]:
        """The walked nodes as the Python walk gives them (for the problem finder's forward search, which
        reads their saved tensors: only when a backward starts from a NaN or an Inf)."""
        g = self.graph
        nm = names()
        out = []
        for i in range(g.size):
            rec = NodeRecord(i, g.node(i), nm[int(g.name[i])], g.kind_of(i), int(g.seq[i]), g.params.get(i), ())
            rec.children = g.children(i)
            out.append(rec)
        return out

    # ---- the end of the step
    def assemble(self, attributed: tuple[list[str | None], list[str | None]],
                 cache: StructureCache) -> tuple[LazyNodes, LazyTuples, LazyTuples]:
        """The step's nodes (made when read), edges and execution order, from the tables; `attributed`:
        every node's module and source line (`carry.attribution`). Call after the hooks are removed and
        the summariser's `finalize`."""
        g = self.graph
        runs_b, slots_b, summs_b, chunks, py, _failures = g.rec.records()
        rows_b, start_b, ks_b, raw_b, bad, evicted = g.rec.tables()  # the counting sort and the arena's gather, in C++
        runs = np.frombuffer(runs_b, RUN_DTYPE)
        slots = np.frombuffer(slots_b, np.int32)
        tensors = TensorTable(np.frombuffer(summs_b, SUMM_DTYPE), chunks, py,
                              np.frombuffer(raw_b, np.float64).reshape(-1, 8), bad, evicted)
        mods, sources = attributed
        g.share_structure(cache)
        kinds = _kinds(g, cache)
        nm = names(g.name)
        statics = _statics(g, nm, kinds, mods, cache)
        outputs = Outputs.lazy(partial(arrays_of, _OUTPUTS, g.buffers(_OUTPUTS)), dtype_names())
        tables = StepTables(nm, g.name, kinds, mods, dict(g.params), sources, statics, outputs, g.child_off,
                            g.child_id, g.child_nr, runs, slots, tensors,
                            (np.frombuffer(rows_b, np.int64), np.frombuffer(start_b, np.int64)))
        tables.relu_slots = g.rec.first_slots(relu_codes())
        self.tables = tables
        nodes = LazyNodes(tables)
        roots = self._roots  # (rows of the tensor table, made `TensorTrace`s when read)
        rows = g.rec.root_rows([(rid, nr, bp.index, bp.start) for bp, rid, nr in roots]) if roots else []
        for (bp, _rid, _nr), row in zip(roots, rows):
            if type(bp.root_grads) is not TableList:
                bp.root_grads = TableList(tensors, bp.root_grads)
            bp.root_grads.add_row(row)
        # the edges and the execution order as columns, made into tuples when read (NOTE [Lazy columns])
        return nodes, LazyTuples(*_edges(g, cache)), LazyTuples(runs["node"], np.frombuffer(ks_b, np.int64))

    def resolve_params(self, traces: dict[str, Any], replaced: Collection[str], unmade: dict[str, tuple[float, bool]],
                       held: dict[str, tuple[float, bool]]) -> tuple[dict[str, Any], list[str]]:
        """`traces` (`ParamGradients.traces`) with each arrival and each row `settle` made as its tensor-table row, left
        out where none was made or where `replaced` holds it (its norm and whether it counted a NaN or an Inf then put
        in `unmade`; those of a row the kernel made and left in, in `held`), and the names so given rows: one extension
        call (NOTE [Parameter rules in one call] in csrc/param_grads.h)."""
        return self.graph.rec.resolve_params(traces, replaced, unmade, held)  # type: ignore[no-any-return]

    def arrival_norms(self, positions: list[int]) -> list[float] | None:
        """The norms of what arrived in the AccumulateGrad runs of `positions`, or None unless the kernel summarised
        each one and none counted a NaN or an Inf: one extension call."""
        return self.graph.rec.arrival_norms(positions)  # type: ignore[no-any-return]

    def summarise(self, grads: Sequence[torch.Tensor]) -> list[int]:
        """Summarise `grads` into the step's summaries, as a hook would: each one's row of the tensor table
        (`tables.tensors`, made at `assemble`), or -1 where none was made."""
        return self.graph.rec.summarise(grads)  # type: ignore[no-any-return]

    def row_norms(self, rows: list[int]) -> list[float | None]:
        """Each summary row's L2 norm from the kernel's statistics, as torch's norm gives it (None: Python made it)."""
        return self.graph.rec.row_norms(rows)  # type: ignore[no-any-return]

    def release(self) -> None:
        self.graph.release()


_KIND_CUSTOM = KINDS.index("custom")


def _kinds(g: NativeGraph, cache: StructureCache) -> list[str]:
    """Each node's kind, as `NodeTrace.kind` says it (an AccumulateGrad node is "param" or "leaf"); made once
    per graph structure and set of parameter nodes, the list shared by the steps (read it, do not mutate it)."""
    key = ("kinds", g.digest(), tuple(g.params))
    kinds = cache.get(key)
    if kinds is None:
        table = np.array(KINDS, dtype=object)[g.kind.astype(np.int64)]
        for i in np.nonzero(g.kind == KINDS.index("acc"))[0].tolist():
            table[i] = "param" if i in g.params else "leaf"
        kinds = cache.put(key, table.tolist())
    return kinds


def _statics(g: NativeGraph, nm: list[str], kinds: list[str], mods: list[str | None],
             cache: StructureCache) -> list[NodeStatics]:
    """Every node's slot arguments, labels and schema, from the Tracer's `StructureCache`, keyed by the
    graph's structure as the Python walk keys it (tracer/record/structure.py)."""
    # the digest holds the name codes, which name the same names for the whole process (`names`)
    custom = np.flatnonzero(g.kind == _KIND_CUSTOM).tolist() if g.has_kinds("custom") else []
    key = ("native", g.digest(), tuple(mods), tuple(sorted(g.params.items())), tuple(sorted(g.leaves.items())),
           tuple(type(g.node(i)) for i in custom))
    statics = cache.get(key)
    if statics is None:
        graph = ArrayGraph(nm, g.name.tolist(), kinds, mods, g.params, g.acc_shapes, g.child_off, g.child_id)
        statics = cache.put(key, grouped_statics(graph, lambda i: _compat.forward_class(g.node(i))))
    return statics


def _edges(g: NativeGraph, cache: StructureCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (node, child, slot) columns of every edge between walked nodes (made once per graph structure;
    read-only, shared by the steps)."""
    key = ("edges", g.digest())
    edges = cache.get(key)
    if edges is None:
        src = np.repeat(np.arange(g.size, dtype=np.int32), np.diff(g.child_off))
        slot = np.arange(len(g.child_id), dtype=np.int32) - g.child_off[src].astype(np.int32)
        ok = g.child_id >= 0
        edges = (src[ok], g.child_id[ok], slot[ok])
        for col in edges:
            col.flags.writeable = False
        edges = cache.put(key, edges)
    return edges  # type: ignore[no-any-return]
