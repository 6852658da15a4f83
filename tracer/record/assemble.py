"""Assembly of a step the Python recorder made, once its hooks are removed: the walked nodes and what each
ran with, as the native recorder's tables (`StepTables`), so a step is one form whichever recorder made it.

NOTE [Python steps as tables]
    The native recorder leaves a step as tables (NOTE [Step tables] in tables.py): `StepTrace.nodes` is a
    `LazyNodes` over them, and the store, the sinks and the page write and read its column document from
    them (tracer/record/wire_columns.py). The Python recorder's node hooks fill `NodeRecord`s with `NodeRun`s
    and `TensorTrace`s as the backward runs; here they are laid out in the same tables:
    - per node its name (a code into the step's own name list), kind, module, parameter, source line and
      statics (`NodeStatics`, shared through the Tracer's `StructureCache`), its slots' children and the
      shape and dtype of each forward output (`Outputs`, dtype codes into the step's own names);
    - one run per row in the order they ran, its `go` and `gi` as rows of the tensor table in `slots`;
    - a tensor table whose every summary is Python's (`TensorTable.py`): each distinct `TensorTrace` once,
      so two slots that hold the same object share a row, as the native recorder's share a summary;
    - the ReLU-like nodes' first `gi` and `go` rows, for the dead-unit check (`relu_slots`).
    Reading a node makes its `NodeTrace` from the tables, as for a native step; the `TensorTrace`s are the
    hooks' own objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gradscape.tracer import _compat
from gradscape.tracer._model import TensorTrace
from gradscape.tracer.record.forward import ForwardRecorder
from gradscape.tracer.record.structure import NodeStatics
from gradscape.tracer.record.tables import RUN_DTYPE, LazyNodes, Outputs, StepTables
from gradscape.tracer.record.tensor_table import TensorTable
from gradscape.tracer.record.walk import NodeRecord
from gradscape.tracer.summary.stats import dtype_name

_ACC_SEQ = (1 << 64) - 1  # the sequence number of every AccumulateGrad node (it has no source line)


def _shape(meta: Any) -> tuple[int, ...] | None:
    try:
        return tuple(map(int, meta.shape))  # int(): a symbolic size with a value becomes that value
    except Exception:  # nested tensors and unbacked symbolic shapes have no plain shape
        return None


def _outputs_of(rec: NodeRecord) -> tuple[list[Any], list[str | None]]:
    """Shapes and dtype names of a node's forward outputs. The engine gave every gradient that
    arrived at a node its output's shape and dtype (it checks and casts them against the node's
    input metadata), so a node that ran with all its gradients answers from their summaries;
    the others read the metadata."""
    runs = rec.runs
    if runs:
        gos = runs[0].grad_outputs
        if len(gos) == 1:  # most nodes: one output
            g = gos[0]
            if g is not None:
                return [g.shape], [g.dtype]
        elif None not in gos:
            return [g.shape for g in gos], [g.dtype for g in gos]  # type: ignore[union-attr]
    meta = _compat.input_metadata(rec.node)
    return [_shape(m) for m in meta], [dtype_name(m.dtype) for m in meta]


def edges_of(records: list[NodeRecord]) -> list[tuple[int, int, int]]:
    """(node, child, slot) of every edge between walked nodes."""
    return [(r.id, c[0], j) for r in records for j, c in enumerate(r.children) if c is not None]


def _outputs(outs: list[tuple[list[Any], list[str | None]]]) -> Outputs:
    """Each node's forward outputs (shapes and dtype names, as read at assembly) as columns, the dtype names
    coded in the order met."""
    codes: dict[str, int] = {}
    off: list[int] = [0]
    ndim: list[int] = []
    dtype: list[int] = []
    dims: list[int] = []
    for shapes, dtypes in outs:
        for shape, dt in zip(shapes, dtypes):
            ndim.append(-1 if shape is None else len(shape))
            dims.extend(shape or ())
            dtype.append(-1 if dt is None else codes.setdefault(dt, len(codes)))
        off.append(len(ndim))
    return Outputs(np.array(off, np.int64), np.array(ndim, np.int32), np.array(dtype, np.int32),
                   np.array(dims, np.int64), {c: nm for nm, c in codes.items()})


class _Rows:
    """The step's tensor table as it is filled: each distinct `TensorTrace`'s row, by object."""

    def __init__(self) -> None:
        self.py: list[TensorTrace] = []
        self._row: dict[int, int] = {}

    def of(self, ts: list[TensorTrace | None]) -> list[int]:
        out = []
        for t in ts:
            if t is None:
                out.append(-1)
                continue
            k = self._row.get(id(t))
            if k is None:
                k = self._row[id(t)] = len(self.py)
                self.py.append(t)
            out.append(k)
        return out

    def table(self) -> TensorTable:
        return TensorTable.of_traces(self.py)


def _runs(records: list[NodeRecord], execution: list[tuple[int, int]], rows: _Rows) -> tuple[np.ndarray, list[int]]:
    """One row per run, in the order they ran, and the slots its `go` and `gi` name."""
    runs = np.zeros(len(execution), RUN_DTYPE)
    cols: dict[str, list[Any]] = {k: [] for k in ("node", "pass", "time", "go_off", "go_n", "gi_off", "gi_n")}
    node, pass_, time, go_off, go_n, gi_off, gi_n = cols.values()
    slots: list[int] = []
    for rid, k in execution:
        r = records[rid].runs[k]
        node.append(rid)
        pass_.append(r.pass_index)
        time.append(np.nan if r.time_us is None else r.time_us)
        go_off.append(len(slots))
        go_n.append(len(r.grad_outputs))
        slots += rows.of(r.grad_outputs)
        gi = r.grad_inputs
        gi_off.append(len(slots) if gi is not None else 0)
        gi_n.append(-1 if gi is None else len(gi))
        slots += rows.of(gi or [])
    for name, col in cols.items():
        runs[name] = col
    return runs, slots


def python_tables(records: list[NodeRecord], execution: list[tuple[int, int]], forward: ForwardRecorder,
                  statics_of: Callable[[list[str | None]], list[NodeStatics]]) -> LazyNodes:
    """The step's nodes as tables (NOTE [Python steps as tables]); `execution`: (node, run) of every run in
    the order they ran; `statics_of`: the nodes' slot arguments, labels and schemas from their modules
    (`StepView.slot_statics`)."""
    mods = forward.modules_of([r.seq for r in records])
    source_of = forward.source_of
    names: dict[str, int] = {}
    name_code = np.array([names.setdefault(r.name, len(names)) for r in records], np.int32)
    child_off: list[int] = [0]
    child_id: list[int] = []
    child_nr: list[int] = []
    for r in records:
        for c in r.children:
            child_id.append(-1 if c is None else c[0])
            child_nr.append(0 if c is None else c[1])
        child_off.append(len(child_id))
    rows = _Rows()
    runs, slots = _runs(records, execution, rows)
    run_node = runs["node"].astype(np.int64)
    by_node = np.argsort(run_node, kind="stable")
    run_start = np.concatenate([[0], np.cumsum(np.bincount(run_node, minlength=len(records)))]).astype(np.int64)
    tables = StepTables(list(names), name_code, [r.kind for r in records], mods,
                        {r.id: r.param for r in records if r.param is not None},
                        [None if r.seq == _ACC_SEQ else source_of(r.seq) for r in records], statics_of(mods),
                        _outputs([_outputs_of(r) for r in records]), np.array(child_off, np.int64),
                        np.array(child_id, np.int32), np.array(child_nr, np.int32), runs,
                        np.array(slots, np.int32), rows.table(), (by_node.astype(np.int64), run_start))
    tables.relu_slots = tables.first_relu_slots()
    return LazyNodes(tables)
