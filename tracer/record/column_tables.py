"""A stored column step's nodes read back as the recorders' tables (`StepTables`), so a step loaded from a
trace file is the same form as one a recorder made.

NOTE [Read back as tables]
    A column document (NOTE [Column document] in tracer/wire/columns.py) holds the step's tables as they
    were written; `gradscape.load` used to make a `NodeTrace`, its `NodeRun`s and input shapes for every
    node of it when read. Here the columns become a `StepTables` as they are (the codes made into per-node
    lists, the statics into one `NodeStatics` per distinct code, the runs into their rows) over a tensor
    table of the step's `TensorTrace`s, and `StepTrace.nodes` is a `LazyNodes`: a node's `NodeTrace` is made
    when first read, as for a recorded step. Writing it again writes its columns from these tables
    (tracer/record/wire_columns.py).
"""

from __future__ import annotations

import numpy as np

from gradscape.tracer._model import TensorTrace
from gradscape.tracer.record.labels import RELU_LIKE
from gradscape.tracer.record.structure import NodeStatics
from gradscape.tracer.record.tables import RUN_DTYPE, LazyNodes, Outputs, StepTables
from gradscape.tracer.record.tensor_table import TensorTable
from gradscape.tracer.wire.columns import StepColumns

_RUN_COLUMNS = {"node": "run_node", "pass": "run_pass", "time": "run_time", "go_off": "go_off", "go_n": "go_n",
                "gi_off": "gi_off", "gi_n": "gi_n"}


def _relu_slots(t: StepTables) -> list[tuple[int, int, int]]:
    """(node, sent row, came row) of each ReLU-like node whose first run sent and got slot 0 (`relu_slots`)."""
    out = []
    for k in np.flatnonzero(np.isin(t.name_code, [i for i, nm in enumerate(t.names) if nm in RELU_LIKE])).tolist():
        rows = t.node_runs(k)
        if not len(rows):
            continue
        r = t.runs[int(rows[0])]
        if r["gi_n"] > 0 and r["go_n"] > 0:
            sent, came = int(t.slots[int(r["gi_off"])]), int(t.slots[int(r["go_off"])])
            if sent >= 0 and came >= 0:
                out.append((k, sent, came))
    return out


def column_nodes(cols: StepColumns, tensors: list[TensorTrace]) -> LazyNodes:
    """The nodes of a checked column document (`StepColumns`) over `tensors`, the step's `TensorTrace`s by
    number (NOTE [Read back as tables])."""
    a, tab = cols.a, cols.tables

    def per_node(key: str) -> list[object]:
        table = tab[key]
        return [table[c] for c in a[f"{key}_code"].tolist()]

    statics = [NodeStatics(list(args), list(labels), schema) for schema, labels, args in tab["static"]]
    runs = np.zeros(len(a["run_node"]), RUN_DTYPE)
    for field, column in _RUN_COLUMNS.items():
        runs[field] = a[column]
    tables = StepTables(list(tab["name"]), a["name_code"], per_node("kind"), per_node("module"),  # type: ignore[arg-type]
                        dict(cols.params), per_node("source"), [statics[c] for c in a["static_code"].tolist()],  # type: ignore[arg-type]
                        Outputs(a["out_off"], a["out_ndim"], a["out_dtype"], a["out_dims"], dict(cols.dtypes)),
                        a["child_off"], a["child_id"], a["child_nr"], runs, a["slots"], TensorTable.of_traces(tensors),
                        (cols.by_node.astype(np.int64), cols.run_start.astype(np.int64)))
    tables.relu_slots = _relu_slots(tables)
    return LazyNodes(tables)
