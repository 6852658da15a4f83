"""A step a tracer sent as columns (NOTE [Column document]): checked as the server checks a step in wire form,
and made into the document the store keeps, in the schema's own form.

The sent message is the step's document (its fields and `columns`) with `arrays`: each tensor's `[thumb,
values]`, wire arrays or nil, by position. Every table of the columns is checked for its types here, their
arrays and offsets by `StepColumns`; then the step is read as the maps it stands for, with its arrays, by
`step_from_wire`, which checks every field as it checks a step in wire form. What is stored is made from what
was checked: the columns' arrays and tables as read (nothing else the message held), the tensor maps and the
other fields as the schema writes them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscape.tracer._model import StepTrace
from gradscape.tracer.wire.codec import TensorTable, step_fields, tensor_summary
from gradscape.tracer.wire.columns import COLUMNS_VERSION, NODE_ARRAYS, TENSOR_ARRAYS, StepColumns
from gradscape.tracer.wire.types import TraceFormatError, WireArray
from gradscape.tracer.wire.validation import checked_list, step_from_wire


def _strs(v: Any, where: str, none: bool = False) -> list[Any]:
    items = checked_list(v, where)
    for k, s in enumerate(items):
        if not (isinstance(s, str) or none and s is None):
            raise TraceFormatError(f"{where}[{k}]: expected a string{' or nil' if none else ''}, got {s!r:.60}")
    return items


def _tables(d: Any) -> None:
    """The types of a sent column document's tables (`StepColumns` checks its arrays against them)."""
    if not isinstance(d, dict) or not isinstance(d.get("nodes"), dict) or not isinstance(d.get("tensors"), dict):
        raise TraceFormatError("columns: expected a map with the maps `nodes` and `tensors`")
    nd, td = d["nodes"], d["tensors"]
    for key, none in (("name", False), ("kind", False), ("module", True), ("source", True)):
        _strs(nd.get(key), f"columns.nodes.{key}", none)
    for k, st in enumerate(checked_list(nd.get("static"), "columns.nodes.static")):
        if not (isinstance(st, list) and len(st) == 3 and (st[0] is None or isinstance(st[0], str))):
            raise TraceFormatError(f"columns.nodes.static[{k}]: expected [schema, labels, args]")
        _strs(st[1], f"columns.nodes.static[{k}][1]")
        _strs(st[2], f"columns.nodes.static[{k}][2]")
    pairs = (("params", nd, str), ("dtypes", nd, (str, type(None))), ("maps", td, dict))
    for key, where, kind in pairs:
        for k, pair in enumerate(checked_list(where.get(key), f"columns.{key}")):
            if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int and isinstance(pair[1], kind)):
                raise TraceFormatError(f"columns.{key}[{k}]: expected [int, {getattr(kind, '__name__', 'value')}]")
    for k, p in enumerate(checked_list(td.get("plans"), "columns.tensors.plans")):
        if not (isinstance(p, list) and len(p) == 4 and isinstance(p[0], list)
                and all(type(x) is int and x >= 0 for x in p[0]) and all(isinstance(x, str) for x in p[1:])):
            raise TraceFormatError(f"columns.tensors.plans[{k}]: expected [shape, dtype, view, device]")
    for k, m in enumerate(checked_list(td.get("extra"), "columns.tensors.extra")):
        if not isinstance(m, dict):
            raise TraceFormatError(f"columns.tensors.extra[{k}]: expected a tensor map")
    for where, key in ((nd, "n"), (td, "n")):
        if type(where.get(key)) is not int or where[key] < 0:
            raise TraceFormatError("columns: `n` of nodes and tensors: expected non-negative ints")


def _stored(cols: StepColumns, tensors: list[Any]) -> dict[str, Any]:
    """The columns as the store keeps them: what was read of them, the tensor maps rebuilt from the checked
    tensors (`tensors`, by position)."""
    a, t = cols.a, cols.t
    nodes = {"n": cols.n_nodes, **{k: list(v) for k, v in cols.tables.items()},
             "params": [[k, p] for k, p in sorted(cols.params.items())],
             "dtypes": [[c, nm] for c, nm in sorted(cols.dtypes.items())],
             **{k: np.ascontiguousarray(a[k], dt).tobytes() for k, dt in NODE_ARRAYS.items()}}
    rows = cols.n_rows
    return {"version": COLUMNS_VERSION, "nodes": nodes, "tensors": {
        "n": rows, "plans": [list(p) for p in cols.plans],
        "maps": [[r, tensor_summary(tensors[r])] for r in sorted(cols.maps)],
        "extra": [tensor_summary(x) for x in tensors[rows:]],
        **{k: np.ascontiguousarray(t[k], dt).tobytes() for k, dt in TENSOR_ARRAYS.items()}}}


def column_step(doc: Any) -> tuple[StepTrace, dict[str, Any], list[tuple[WireArray | None, WireArray | None]]]:
    """A sent column step checked: (its `StepTrace`, the document to store, each tensor's (thumb, values)
    wire arrays). Raises `TraceFormatError` naming what is wrong."""
    if not isinstance(doc, dict):
        raise TraceFormatError(f"step: expected a map, got {type(doc).__name__}")
    _tables(doc.get("columns"))
    cols = StepColumns(doc["columns"])
    arrays = checked_list(doc.get("arrays"), "arrays")
    if len(arrays) != cols.n_tensors or not all(isinstance(x, list) and len(x) == 2 for x in arrays):
        raise TraceFormatError(f"arrays: expected [thumb, values] for each of the step's {cols.n_tensors} tensors")
    wire = {k: v for k, v in doc.items() if k not in ("columns", "arrays")}
    wire.update(nodes=cols.nodes(), edges=cols.edges(), execution=cols.execution(),
                tensors=[{**t, "thumb": th, "values": v} for t, (th, v) in zip(cols.tensors(), arrays)])
    built: list[Any] = []
    trace = step_from_wire(wire, tensors_out=built)
    tab = TensorTable(apart=True, base=len(built), known={id(x): i for i, x in enumerate(built)})
    fields = step_fields(trace, tab)
    del fields["execution"]  # the runs' order, which the columns hold
    return trace, {**fields, "columns": _stored(cols, built)}, [(th, v) for th, v in arrays]
