"""A stored column step read back as a `StepTrace`: its tensors made from the columns directly, its nodes by
the caller's maker over the columns (tracer/record/column_tables.py: NOTE [Read back as tables]).

NOTE [Column read]
    `gradscape.load` of a 100k-node step stored as columns (NOTE [Column document] in columns.py) made
    100k node maps and 176k tensor maps of the columns, then read each map back (`fast_read`): half of a
    2 s load. Here the columns' tables are checked for their types once (`column_check.check_tables`, as the
    server checks a step sent as columns), their arrays and offsets by `StepColumns`, and every
    `TensorTrace` is made of them directly, as `step_from_wire` makes them of the maps; the nodes are the
    columns' own tables, each `NodeTrace` made when read (tests/test_wire_columns.py holds a step read back
    either way equal). The other fields are read by `fields_from_wire`, which checks each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gradscape.tracer._model import NodeTrace, StepTrace, TensorTrace, fill
from gradscape.tracer.collector import collector_paused
from gradscape.tracer.wire.column_check import check_tables
from gradscape.tracer.wire.columns import StepColumns
from gradscape.tracer.wire.types import TensorNumpy, TraceFormatError
from gradscape.tracer.wire.validation import Refs, fields_from_wire
from gradscape.tracer.wire.versions import with_defaults


@collector_paused()  # NOTE [Collector paused] in tracer/collector.py
def step_from_columns(doc: dict[str, Any], arrays: dict[int, TensorNumpy] | None,
                      nodes_of: Callable[[StepColumns, list[TensorTrace]], Sequence[NodeTrace]]) -> StepTrace:
    """The `StepTrace` of a stored column document (unpacked; its `columns` are taken out of it); `arrays`: the
    (thumbnail, values) of tensors by number; `nodes_of`: the step's nodes of its columns and its tensors.
    Raises `TraceFormatError` naming what is wrong."""
    columns = doc.pop("columns")
    check_tables(columns)
    cols = StepColumns(columns)
    tensors = cols.tensor_traces()
    for i, (thumb, values) in (arrays or {}).items():
        if not 0 <= i < len(tensors):
            raise TraceFormatError(f"arrays: tensor {i} is not one of the step's {len(tensors)}")
        tensors[i].thumb, tensors[i].values = thumb, values
    st = fields_from_wire(dict(with_defaults(doc)), Refs(tensors, cols.n_nodes))
    fill(st, nodes=nodes_of(cols, tensors), edges=[(a, b, slot) for a, b, slot in cols.edges()],
         execution=[(node, k) for node, k in cols.execution()])
    return st
