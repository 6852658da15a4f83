"""A recorded step as the trace file stores it: its nodes and tensors as columns, from its tables (either
recorder's: NOTE [Python steps as tables] in assemble.py).

The form is NOTE [Column document] in tracer/wire/columns.py. The node columns are the recorder's own arrays
(NOTE [Step tables] in tables.py), written as they are; the tensors are rows of the step's tensor table, in
the order the maps numbered them (NOTE [Columns of any step] in tracer/wire/trace_columns.py), found with
numpy (`_first_met`), so a step reads back numbered alike whichever writer wrote it. A row Python summarised
is written from its `TensorTrace` (a plan of its own and its statistics); a kernel row whose `TensorTrace`
was made (a module call, a parameter or a pass holds it) takes its arrays from the object, so whatever was
done to them since (the thumbnail budget) is what is written, and its summary from the columns: nothing
changes a summary after it is made. Nodes are written from the tables even when one was made: nothing
changes a `NodeTrace` after it is made from them (tests/test_wire_columns.py holds the two forms equal).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from gradscape.tracer._model import StepTrace
from gradscape.tracer.collector import collector_paused
from gradscape.tracer.record.tables import LazyNodes, StepTables
from gradscape.tracer.record.tensor_table import TensorTable
from gradscape.tracer.record.thumb_stacks import Stacks, thumb_stacks
from gradscape.tracer.summary.fastpath import KERNEL_PLANS
from gradscape.tracer.wire.codec import TensorTable as WireTensors
from gradscape.tracer.wire.codec import step_fields, tensor_summary
from gradscape.tracer.wire.column_doc import codes, document, plan_codes, plan_key
from gradscape.tracer.wire.types import TensorNumpy

# id of a step's statics list (shared by the steps of one graph shape: StructureCache) -> (the list, its codes)
_STATIC_CODES: dict[int, tuple[list[Any], np.ndarray, list[list[Any]]]] = {}
_STATIC_LOCK = threading.Lock()


def _codes(values: list[Any]) -> tuple[list[Any], np.ndarray]:
    """The distinct `values` (hashable) in the order met, and each value's position among them (`codes`)."""
    table, code = codes(values)
    return table, np.array(code, np.int32)


def _static_codes(statics: list[Any]) -> tuple[np.ndarray, list[list[Any]]]:
    """Each node's code into the distinct `[schema, labels, args]` of `statics`, made once per statics list
    (the file sink and the socket sink's thread may ask at once)."""
    with _STATIC_LOCK:
        hit = _STATIC_CODES.get(id(statics))
    if hit is not None and hit[0] is statics:
        return hit[1], hit[2]
    seen: dict[Any, int] = {}
    by_list: dict[tuple[int, int, Any], int] = {}  # nodes share their lists (NOTE [Grouped statics]): one read each
    codes = []
    for s in statics:
        k = by_list.get((id(s.labels), id(s.args), s.schema))
        if k is None:
            k = by_list[(id(s.labels), id(s.args), s.schema)] = seen.setdefault(
                (s.schema, tuple(s.labels), tuple(s.args)), len(seen))
        codes.append(k)
    code = np.array(codes, np.int32)
    table = [[schema, list(labels), list(args)] for schema, labels, args in seen]
    with _STATIC_LOCK:
        if len(_STATIC_CODES) >= 4:
            _STATIC_CODES.pop(next(iter(_STATIC_CODES)))
        _STATIC_CODES[id(statics)] = (statics, code, table)
    return code, table


def _node_columns(t: StepTables, slots: np.ndarray) -> dict[str, Any]:
    out = t.outputs
    kinds, kind_code = _codes(t.kinds)
    modules, module_code = _codes(t.modules)
    sources, source_code = _codes(t.sources)
    static_code, statics = _static_codes(t.statics)
    r = t.runs
    arrays = {"name_code": t.name_code, "kind_code": kind_code, "module_code": module_code,
              "source_code": source_code, "static_code": static_code, "child_off": t.child_off,
              "child_id": t.child_id, "child_nr": t.child_nr, "out_off": out.off, "out_ndim": out.ndim,
              "out_dtype": out.dtype, "out_dims": out.dims, "run_node": r["node"], "run_pass": r["pass"],
              "run_time": r["time"], "go_off": r["go_off"], "go_n": r["go_n"], "gi_off": r["gi_off"],
              "gi_n": r["gi_n"], "slots": slots}
    return {"n": len(t.name_code), "name": list(t.names), "kind": kinds, "module": modules, "source": sources,
            "static": statics, "params": [[k, p] for k, p in sorted(t.params.items())],
            "dtypes": [[c, nm] for c, nm in sorted(out.names.items())], **arrays}


def _first_met(t: StepTables) -> np.ndarray:
    """The tensor rows the nodes' slots name, in the order they are first met (NOTE [Columns of any step] in
    tracer/wire/trace_columns.py): node by node, its first run's `gi` then `go`, every later run's `go` then
    `gi`."""
    r, pos = t.runs, t.run_rows
    is_first = np.zeros(len(pos), bool)
    starts = t.run_start[:-1]
    is_first[starts[starts < t.run_start[1:]]] = True
    gi_off, gi_n = r["gi_off"][pos].astype(np.int64), np.maximum(r["gi_n"][pos], 0).astype(np.int64)
    go_off, go_n = r["go_off"][pos].astype(np.int64), r["go_n"][pos].astype(np.int64)
    offs = np.stack([np.where(is_first, gi_off, go_off), np.where(is_first, go_off, gi_off)], axis=1).ravel()
    ns = np.stack([np.where(is_first, gi_n, go_n), np.where(is_first, go_n, gi_n)], axis=1).ravel()
    at = np.repeat(offs - (np.cumsum(ns) - ns), ns) + np.arange(int(ns.sum()))
    rows = t.slots[at].astype(np.int64)
    rows = rows[rows >= 0]
    _, first = np.unique(rows, return_index=True)
    return rows[np.sort(first)]


def _object_rows(tt: TensorTable) -> dict[int, Any]:
    """Row -> its `TensorTrace`, for the rows made into one (their arrays are the object's) and the rows
    Python summarised."""
    rows = {k: tt.py[int(tt.py_index[k])] for k in np.flatnonzero(tt.plan < 0).tolist()}
    rows.update((k, m) for k, m in enumerate(tt._made) if m is not None)
    return rows


def _plans(tt: TensorTable, order: np.ndarray, objects: dict[int, Any]) -> tuple[np.ndarray, list[list[Any]],
                                                                                 np.ndarray, list[Any]]:
    """Each position's code into the plans (`[shape, dtype, view, device]`, sorted: `plan_codes`), the plans,
    and the positions of Python's summaries with their maps."""
    plan = tt.plan[order].astype(np.int64)
    kernel = np.unique(plan[plan >= 0]).tolist()
    py = np.flatnonzero(plan < 0)
    maps = [tensor_summary(objects[int(order[i])]) for i in py.tolist()]
    keys = [plan_key(p.shape, p.dtype, p.view, "cpu") for p in (KERNEL_PLANS[i] for i in kernel)]
    plans, at = plan_codes(keys + [plan_key(m["shape"], m["dtype"], m["view"], m["device"]) for m in maps])
    lookup = np.full(max(kernel, default=0) + 1, -1, np.int64)
    lookup[kernel] = at[:len(kernel)]
    code = np.where(plan >= 0, lookup[np.maximum(plan, 0)], -1)
    code[py] = at[len(kernel):]
    return code, plans, py, maps


def _tensor_columns(tt: TensorTable, order: np.ndarray, objects: dict[int, Any]) -> tuple[dict[str, Any],
                                                                                       list[TensorNumpy], Stacks]:
    """The tensor columns of table rows `order`, in that order; each position's (thumbnail, values) from its
    `TensorTrace` where one was made, and the kernel's thumbnails of the others stacked by shape (NOTE
    [Thumbnail stacks])."""
    code, plans, py, maps = _plans(tt, order, objects)
    get = objects.get
    arrays: list[TensorNumpy] = [_NONE if (o := get(k)) is None else (o.thumb, o.values) for k in order.tolist()]
    skip = np.zeros(len(order), bool)
    if objects:
        skip[np.isin(order, np.fromiter(objects, np.int64, len(objects)))] = True
    stacks = thumb_stacks(tt, order, skip)
    stats = tt.stats_array()[order]
    if len(py):  # Python's summaries: their statistics as their maps hold them
        stats[py] = [m["stats"] for m in maps]
    return {"n": len(order), "plans": plans, "maps": [], "plan_code": code, "stats": stats}, arrays, stacks


_NONE: TensorNumpy = (None, None)


def _made_when_read(st: StepTrace) -> None:
    """The parameters' and roots' `TensorTrace`s made from their rows now (NOTE [Traces made when read] in
    lazy_traces.py), so that the rows made into one are known before the fields are numbered."""
    for _ in st.params.values():
        pass
    for p in st.passes:
        for _ in p.root_grads:
            pass


@collector_paused()  # NOTE [Collector paused] in tracer/collector.py
def column_parts(st: StepTrace) -> tuple[dict[str, Any], list[TensorNumpy], Stacks]:
    """The step's document fields with `columns` in place of `nodes`, `edges` and `tensors`, every tensor's
    (thumbnail, values) by position but the kernel's thumbnails, which come stacked by shape (NOTE [Thumbnail
    stacks] in thumb_stacks.py), of a step whose nodes are a recorder's tables (`LazyNodes`). The store and
    the sinks reach it through the step (`tracer.wire.column_write`, `LazyNodes.column_parts`).
    Tensors are numbered as first met (`_first_met`): the rows the nodes name, then what only the other
    fields name, as maps (`extra`)."""
    lazy = st.nodes
    assert isinstance(lazy, LazyNodes)  # called through `LazyNodes.column_parts` only
    t = lazy.tables
    tt = t.tensors
    order = _first_met(t)
    at = np.full(len(tt) + 1, -1, np.int64)  # row -> its number (the last: a slot without a tensor)
    at[order] = np.arange(len(order))
    _made_when_read(st)
    objects = _object_rows(tt)
    tab = WireTensors(apart=True, base=len(order),
                      known={id(o): int(at[k]) for k, o in objects.items() if at[k] >= 0})
    tab.row_ref = lambda k: int(at[k]) if at[k] >= 0 else tab.ref(tt.get(k))  # NOTE [Lazy module calls]
    # after the rows: what only the modules, parameters and passes name; not the runs' order, which the columns hold
    fields = step_fields(st, tab, execution=False)
    tensors, arrays, stacks = _tensor_columns(tt, order, objects)
    doc = document(fields, _node_columns(t, at[t.slots]), {**tensors, "extra": tab.items})
    return doc, arrays + (tab.arrays or []), stacks
