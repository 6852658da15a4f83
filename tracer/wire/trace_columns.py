"""A `StepTrace` whose nodes are a list of `NodeTrace`s as the column document (NOTE [Column document] in
columns.py): a step read from maps (a file of an earlier release, an older tracer's), or one built by hand.

NOTE [Columns of any step]
    A step either recorder made, or read back from columns, writes its columns from its tables
    (tracer/record/wire_columns.py; NOTE [Python steps as tables] in tracer/record/assemble.py). A step whose
    nodes are a list is written here from them, so every step is stored and sent in one form. The columns
    hold less than the maps do, by design:
    - a node's input shapes are its children's output shapes. `child_nr`, the output a slot takes, is
      stored only for that; a `NodeTrace` does not keep it, so the first output of that shape is named (one
      past the last for no shape);
    - a run's position is its place in the step's order;
    - a node's order, `grad_inputs`, `grad_outputs` and `time_us` are its first run's.
    The recorders make their steps so, and so do the releases that wrote maps. A step that is not (one built by
    hand with other values) is refused: `column_parts` raises `TraceFormatError` naming the first field that
    disagrees: nothing writes the maps any more (NOTE [Maps of earlier releases] in earlier/__init__.py).
    Tensors are numbered as the maps numbered them, as first met: the nodes' (each node's first `gi`, its
    first `go`, then each run's `go` and `gi`) are the rows (each a plan, `[shape, dtype, view, device]`, and
    its 8 statistics); what only the other fields name comes after them as maps (`extra`). The codes, the
    plans' order and the document's layout are column_doc.py's, as for a step written from its tables: a
    Python-recorded step written either way is the same bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscape.tracer._model import STAT_NAMES, NodeTrace, StepTrace
from gradscape.tracer.collector import collector_paused
from gradscape.tracer.wire.codec import TensorTable, step_fields
from gradscape.tracer.wire.column_doc import codes, document, plan_codes, plan_key
from gradscape.tracer.wire.types import TensorNumpy, TraceFormatError


class _NotColumns(Exception):
    """The step holds something the columns cannot (NOTE [Columns of any step]): what, in words."""


def _strs(values: Any, where: str) -> list[str]:
    if not all(isinstance(v, str) for v in values):
        raise _NotColumns(f"{where} are not all strings: {list(values)!r}")
    return list(values)


def _static(n: NodeTrace) -> list[Any]:
    if n.schema is not None and not isinstance(n.schema, str):
        raise _NotColumns(f"node {n.id}'s schema is not a string: {n.schema!r}")
    return [n.schema, _strs(n.input_labels, f"node {n.id}'s input labels"),
            _strs(n.input_args, f"node {n.id}'s input args")]


def _slots(nodes: list[NodeTrace], edges: list[tuple[int, int, int]]) -> tuple[list[int], list[int], list[int]]:
    """`child_off`, `child_id`, `child_nr`: each node's slots, their children as the edges give them, and the
    output of the child whose shape each slot's input shape is."""
    child: dict[tuple[int, int], int] = {}
    for src, dst, slot in edges:
        child[(src, slot)] = dst
    off, ids, nrs = [0], [], []
    for n in nodes:
        for j, shape in enumerate(n.input_shapes):
            c = child.pop((n.id, j), -1)
            if c < 0:
                if shape is not None:
                    raise _NotColumns(f"node {n.id}'s slot {j} has an input shape {shape} but no child")
                ids.append(-1)
                nrs.append(0)
                continue
            outs = [None if s is None else tuple(s) for s in nodes[c].output_shapes]
            if shape is None:
                nrs.append(len(outs))  # past the child's outputs: no shape
            elif tuple(shape) in outs:
                nrs.append(outs.index(tuple(shape)))
            else:
                raise _NotColumns(f"node {n.id}'s slot {j} has input shape {tuple(shape)}, none of its child "
                                  f"{c}'s output shapes {outs}")
            ids.append(c)
        off.append(len(ids))
    if child:
        (src, slot), dst = next(iter(child.items()))
        raise _NotColumns(f"the edge {src} -> {dst} leaves slot {slot}, which node {src} does not have")
    return off, ids, nrs


def _outputs(nodes: list[NodeTrace]) -> tuple[dict[str, list[int]], list[list[Any]]]:
    off: list[int] = [0]
    ndim: list[int] = []
    dtype: list[int] = []
    dims: list[int] = []
    names: dict[str, int] = {}
    for n in nodes:
        if len(n.output_dtypes) != len(n.output_shapes):
            raise _NotColumns(f"node {n.id} has {len(n.output_shapes)} output shapes and "
                              f"{len(n.output_dtypes)} output dtypes")
        for shape, dt in zip(n.output_shapes, n.output_dtypes):
            ndim.append(-1 if shape is None else len(shape))
            dims.extend(shape or ())
            dtype.append(-1 if dt is None else names.setdefault(dt, len(names)))
        off.append(len(ndim))
    return {"out_off": off, "out_ndim": ndim, "out_dtype": dtype, "out_dims": dims}, [[c, nm] for nm, c in
                                                                                       names.items()]


def _runs(st: StepTrace, tab: TensorTable) -> dict[str, list[Any]]:
    """The run columns, a row per run in the order they ran, and `slots`; tensors entered in `tab` as the maps
    entered them (NOTE [Columns of any step])."""
    rows: list[Any] = [None] * sum(len(n.runs) for n in st.nodes)
    for n in st.nodes:
        tab.refs(n.grad_inputs)
        tab.refs(n.grad_outputs)
        if not _first_run_agrees(n):
            raise _NotColumns(f"node {n.id}'s order, time or gradients are not its first run's")
        last = -1
        for r in n.runs:
            if not (type(r.order) is int and last < r.order < len(rows)) or rows[r.order] is not None:
                raise _NotColumns(f"node {n.id}'s runs are not at distinct places in the step's "
                                  f"{len(rows)} runs, in order: {[r.order for r in n.runs]}")
            last = r.order
            rows[r.order] = (n.id, r.pass_index, r.time_us, tab.refs_all(r.grad_outputs), tab.refs(r.grad_inputs))
    cols: dict[str, list[Any]] = {k: [] for k in ("run_node", "run_pass", "run_time", "go_off", "go_n", "gi_off",
                                                  "gi_n", "slots")}
    slots = cols["slots"]
    for node, pass_index, time_us, go, gi in rows:
        cols["run_node"].append(node)
        cols["run_pass"].append(pass_index)
        cols["run_time"].append(np.nan if time_us is None else time_us)
        cols["go_off"].append(len(slots))
        cols["go_n"].append(len(go))
        slots.extend(-1 if t is None else t for t in go)
        cols["gi_off"].append(len(slots) if gi is not None else 0)
        cols["gi_n"].append(-1 if gi is None else len(gi))
        slots.extend(-1 if t is None else t for t in gi or ())
    return cols


def _first_run_agrees(n: NodeTrace) -> bool:
    """The node's order, time and gradients are its first run's (all None for a node that never ran)."""
    if not n.runs:
        return (n.order, n.grad_inputs, n.grad_outputs, n.time_us) == (None, None, None, None)
    first = n.runs[0]
    return (n.order == first.order and n.time_us == first.time_us and _same(n.grad_inputs, first.grad_inputs)
            and _same(n.grad_outputs, first.grad_outputs))


def _same(a: list[Any] | None, b: list[Any] | None) -> bool:
    """The same tensors in the same slots (the objects, not their values)."""
    return a is b or a is not None and b is not None and len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _tensor_columns(items: list[Any]) -> dict[str, Any]:
    """The rows' plans and statistics, of their maps (`tensor_summary`'s form)."""
    plans, plan_code = plan_codes([plan_key(m["shape"], m["dtype"], m["view"], m["device"]) for m in items])
    stats = np.array([m["stats"] for m in items], np.float64).reshape(-1, len(STAT_NAMES))
    return {"n": len(items), "plans": plans, "maps": [], "plan_code": plan_code, "stats": stats}


def _checked_edges(st: StepTrace, nodes: list[NodeTrace]) -> list[tuple[int, int, int]]:
    """The step's edges, after checking that the nodes are numbered by place and named by strings."""
    for k, n in enumerate(nodes):
        if n.id != k:
            raise _NotColumns(f"node {k} of the list has id {n.id!r}: the nodes are numbered by their place")
        if not isinstance(n.name, str) or not isinstance(n.kind, str):
            raise _NotColumns(f"node {k}'s name or kind is not a string: {n.name!r}, {n.kind!r}")
    edges = [(int(a), int(b), int(s)) for a, b, s in st.edges]
    for a, b, _ in edges:
        if not 0 <= b < len(nodes):
            raise _NotColumns(f"the edge {a} -> {b} names no node of the {len(nodes)}")
    return edges


@collector_paused()  # NOTE [Collector paused] in tracer/collector.py
def column_parts(st: StepTrace) -> tuple[dict[str, Any], list[TensorNumpy], dict[Any, Any]]:
    """The step's document fields with `columns` in place of `nodes`, `edges` and `tensors`, and every tensor's
    (thumbnail, values) by number (no stacks: `tracer.wire.column_write`'s form). A step the columns cannot hold
    raises `TraceFormatError` naming what disagrees (NOTE [Columns of any step])."""
    nodes = list(st.nodes)
    try:
        edges = _checked_edges(st, nodes)
        child_off, child_id, child_nr = _slots(nodes, edges)
        if edges != [(k, c, j) for k in range(len(nodes)) for j, c in
                     enumerate(child_id[child_off[k]:child_off[k + 1]]) if c >= 0]:
            raise _NotColumns("the edges are not listed node by node, slot by slot")
        outs, dtypes = _outputs(nodes)
        tab = TensorTable(apart=True)
        runs = _runs(st, tab)
        if [tuple(e) for e in st.execution] != _execution(runs["run_node"]):
            raise _NotColumns("the execution order is not the runs' order")
        statics, static_code = codes([_static(n) for n in nodes], key=repr)
    except _NotColumns as exc:
        raise TraceFormatError(f"step {st.step} of run {st.run!r} cannot be written as columns: {exc}") from None
    n_rows = len(tab.items)
    rows = tab.items[:]
    fields = step_fields(st, tab, execution=False)  # after the rows: what only the other fields name
    names, name_code = codes([n.name for n in nodes])
    kinds, kind_code = codes([n.kind for n in nodes])
    modules, module_code = codes([n.module for n in nodes])
    sources, source_code = codes([n.source for n in nodes])
    node_cols = {"n": len(nodes), "name": names, "kind": kinds, "module": modules, "source": sources,
                 "static": statics, "params": [[n.id, n.param] for n in nodes if n.param is not None],
                 "dtypes": dtypes, "name_code": name_code, "kind_code": kind_code, "module_code": module_code,
                 "source_code": source_code, "static_code": static_code, "child_off": child_off,
                 "child_id": child_id, "child_nr": child_nr, **outs, **runs}
    tensors = {**_tensor_columns(rows), "extra": tab.items[n_rows:]}
    return document(fields, node_cols, tensors), list(tab.arrays or []), {}


def _execution(run_node: list[int]) -> list[tuple[int, int]]:
    """(node, run index) of each run, in the order they ran (`StepColumns.execution`'s form)."""
    seen: dict[int, int] = {}
    out = []
    for node in run_node:
        k = seen.get(node, 0)
        seen[node] = k + 1
        out.append((node, k))
    return out

