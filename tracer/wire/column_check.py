"""A step a tracer sent as columns (NOTE [Column document]): checked as the server checks a step in wire form,
and made into the document the store keeps, in the schema's own form.

The sent message is the step's document (its fields and `columns`) with `arrays`: each tensor's `[thumb,
values]`, wire arrays or nil, by position. Every table of the columns is checked for its types here, their
arrays and offsets by `StepColumns`: a node's map made of them (`StepColumns.node`) then has the types the
schema asks for, and every tensor it names exists. The tensor maps the columns hold and each array are
checked as in a step in wire form (`tensor_from_wire`, `decode_array`), and the other fields where they are
(`checked_fields`, as `step_from_wire` checks them: NOTE [Fields checked in place]). What is stored is made
from what was checked: the columns' arrays and tables as read (nothing else the message held), the tensor
maps and the other fields as the schema writes them. No `StepTrace` is made. At 100k nodes this takes a
fraction of reading the step as maps (no node map is made).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscape.tracer.collector import collector_paused
from gradscape.tracer.wire.arrays import decode_array
from gradscape.tracer.wire.checks import checked_list
from gradscape.tracer.wire.codec import tensor_summary
from gradscape.tracer.wire.columns import COLUMNS_VERSION, NODE_ARRAYS, NODE_TABLES, TENSOR_ARRAYS, StepColumns
from gradscape.tracer.wire.field_check import Counts, checked_fields
from gradscape.tracer.wire.types import TraceFormatError, WireArray
from gradscape.tracer.wire.validation import tensor_from_wire


def _strs(v: Any, where: str, none: bool = False) -> list[Any]:
    items = checked_list(v, where)
    for k, s in enumerate(items):
        if not (isinstance(s, str) or none and s is None):
            raise TraceFormatError(f"{where}[{k}]: expected a string{' or nil' if none else ''}, got {s!r:.60}")
    return items


def check_tables(d: Any) -> None:
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


def _stored(d: dict[str, Any], maps: dict[int, Any], extra: list[Any]) -> dict[str, Any]:
    """The columns as the store keeps them: the checked fields of the sent ones (`d`), none other, and the
    tensor maps given as maps (`maps` by row, `extra` after the rows) as the schema writes them."""
    nd, td = d["nodes"], d["tensors"]
    return {"version": COLUMNS_VERSION, "nodes": {k: nd[k] for k in (*NODE_TABLES, *NODE_ARRAYS)},
            "tensors": {"n": td["n"], "plans": td["plans"], **{k: td[k] for k in TENSOR_ARRAYS},
                        "maps": [[r, tensor_summary(maps[r])] for r in sorted(maps)],
                        "extra": [tensor_summary(x) for x in extra]}}


def _arrays(doc: dict[str, Any], n: int) -> list[tuple[np.ndarray | None, WireArray | None]]:
    """Each tensor's thumbnail, checked and read as an array, and its values, checked, as sent."""
    arrays = checked_list(doc.get("arrays"), "arrays")
    if len(arrays) != n or not all(isinstance(x, list) and len(x) == 2 for x in arrays):
        raise TraceFormatError(f"arrays: expected [thumb, values] for each of the step's {n} tensors")
    out = []
    for i, (th, v) in enumerate(arrays):
        if v is not None:
            decode_array(v, f"tensors[{i}].values")
        out.append((None if th is None else decode_array(th, f"tensors[{i}].thumb"), v))
    return out


@collector_paused()  # NOTE [Collector paused] in tracer/collector.py
def column_step(doc: Any) -> tuple[dict[str, Any], list[tuple[np.ndarray | None, WireArray | None]]]:
    """A sent column step checked: (the document to store, its fields checked in place (NOTE [Fields checked
    in place]); each tensor's thumbnail as an array and values as a wire array). Raises `TraceFormatError`
    naming what is wrong. No `StepTrace` is made, and no node map: the nodes' maps are made of the checked
    tables and arrays when read, and need no check of their own."""
    if not isinstance(doc, dict):
        raise TraceFormatError(f"step: expected a map, got {type(doc).__name__}")
    check_tables(doc.get("columns"))
    cols = StepColumns(doc["columns"])
    arrays = _arrays(doc, cols.n_tensors)
    maps = {r: tensor_from_wire(m, f"columns.tensors.maps[{r}]") for r, m in cols.maps.items()}
    extra = [tensor_from_wire(m, f"columns.tensors.extra[{j}]") for j, m in enumerate(cols.extra)]
    fields = checked_fields(doc, Counts(cols.n_tensors, cols.n_nodes))
    return {**fields, "columns": _stored(doc["columns"], maps, extra)}, arrays
