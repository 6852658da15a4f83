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

from typing import Any

import numpy as np

from gradscape.tracer._model import TensorTrace
from gradscape.tracer.record.structure import NodeStatics
from gradscape.tracer.record.tables import RUN_DTYPE, LazyNodes, Outputs, StepTables
from gradscape.tracer.record.tensor_table import TensorTable
from gradscape.tracer.wire.columns import StepColumns

_RUN_COLUMNS = {"node": "run_node", "pass": "run_pass", "time": "run_time", "go_off": "go_off", "go_n": "go_n",
                "gi_off": "gi_off", "gi_n": "gi_n"}


def column_nodes(cols: StepColumns, tensors: list[TensorTrace]) -> LazyNodes:
    """The nodes of a checked column document (`StepColumns`) over `tensors`, the step's `TensorTrace`s by
    number (NOTE [Read back as tables])."""
    a, tab = cols.a, cols.tables

    def per_node(key: str) -> list[Any]:
        table = tab[key]
        return [table[c] for c in a[f"{key}_code"].tolist()]

    statics = [NodeStatics(list(args), list(labels), schema) for schema, labels, args in tab["static"]]
    runs = np.zeros(len(a["run_node"]), RUN_DTYPE)
    for field, column in _RUN_COLUMNS.items():
        runs[field] = a[column]
    tables = StepTables(list(tab["name"]), a["name_code"], per_node("kind"), per_node("module"),
                        dict(cols.params), per_node("source"), [statics[c] for c in a["static_code"].tolist()],
                        Outputs(a["out_off"], a["out_ndim"], a["out_dtype"], a["out_dims"], dict(cols.dtypes)),
                        a["child_off"], a["child_id"], a["child_nr"], runs, a["slots"], TensorTable.of_traces(tensors),
                        (cols.by_node.astype(np.int64), cols.run_start.astype(np.int64)))
    tables.relu_slots = tables.first_relu_slots()
    return LazyNodes(tables)
