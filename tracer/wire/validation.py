"""The wire form back to a `StepTrace`, every field checked: `step_from_wire` raises `TraceFormatError`
naming the first field that is wrong (nothing else escapes it, whatever the input: tests/test_wire.py
drives random mutations of real steps through it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gradscape.tracer._model import (
    STAT_NAMES,
    BackwardPass,
    ModuleCall,
    ModuleTrace,
    NodeRun,
    NodeTrace,
    OptimizerStep,
    Problem,
    StepTrace,
    TensorTrace,
    fill,
)
from gradscape.tracer.collector import collector_paused
from gradscape.tracer.wire import fast_read
from gradscape.tracer.wire.arrays import decode_array
from gradscape.tracer.wire.checks import (
    a_map,
    a_str,
    an_int,
    checked_list,
    opt_int,
    opt_num,
    opt_str,
    str_list,
    versioned,
)
from gradscape.tracer.wire.field_check import Counts, checked_fields
from gradscape.tracer.wire.types import TensorNumpy, TraceFormatError


def tensor_from_wire(d: dict[str, Any], where: str = "tensor") -> TensorTrace:
    if not isinstance(d, dict):
        raise TraceFormatError(f"{where}: expected a map, got {type(d).__name__}")
    shape = d.get("shape")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise TraceFormatError(f"{where}.shape: expected a list of non-negative ints, got {shape!r}")
    stats = d.get("stats")
    if not isinstance(stats, list) or len(stats) != len(STAT_NAMES) or \
            not all(type(v) in (int, float) for v in stats):
        raise TraceFormatError(f"{where}.stats: expected {len(STAT_NAMES)} numbers ({' '.join(STAT_NAMES)})")
    thumb = d.get("thumb")
    values = d.get("values")
    if thumb is not None and not isinstance(thumb, dict) or values is not None and not isinstance(values, dict):
        raise TraceFormatError(f"{where}.thumb/values: expected an array map or nil")
    return TensorTrace(
        shape=tuple(shape), dtype=a_str(d.get("dtype"), f"{where}.dtype"),
        stats=dict(zip(STAT_NAMES, (float(v) for v in stats))),
        thumb=None if thumb is None else decode_array(thumb, f"{where}.thumb"),
        thumb_view=a_str(d.get("view", ""), f"{where}.view"), device=a_str(d.get("device", "cpu"), f"{where}.device"),
        values=None if values is None else decode_array(values, f"{where}.values"),
    )


class Refs(Counts):
    """`Counts` with the step's tensors themselves ("tensors": any sequence of them, made when read for a
    column step), which a node's or a field's indices resolve to."""

    def __init__(self, tensors: Sequence[TensorTrace], n_nodes: int) -> None:
        super().__init__(len(tensors), n_nodes)
        self.tensors = tensors

    def tensor_list(self, ix: Any, where: str) -> list[TensorTrace | None] | None:
        return None if ix is None else [None if i is None else self.tensors[i] for i in self.tensor_refs(ix, where)]


@collector_paused()  # NOTE [Collector paused] in tracer/collector.py
def step_from_wire(d: Any, arrays: dict[int, TensorNumpy] | None = None) -> StepTrace:
    """Rebuild a `StepTrace`; raises `TraceFormatError` naming the first field that is wrong. `arrays`: the
    (thumbnail, values) of tensors by index, already read as arrays (`TraceStore.read_step`, which keeps
    them apart from the graph), set on the tensors built."""
    d = versioned(d)
    for key in ("run", "step", "nodes", "edges", "tensors"):
        if key not in d:
            raise TraceFormatError(f"step: missing field {key!r}")
    # the common form is read by `fast_read`, and the rest checked field by field (NOTE [Fast read])
    tensors = [fast if (fast := fast_read.tensor(t)) is not None else tensor_from_wire(t, f"tensors[{i}]")
               for i, t in enumerate(checked_list(d["tensors"], "tensors"))]
    for i, (thumb, values) in (arrays or {}).items():
        if not 0 <= i < len(tensors):
            raise TraceFormatError(f"arrays: tensor {i} is not one of the step's {len(tensors)}")
        tensors[i].thumb, tensors[i].values = thumb, values
    refs = Refs(tensors, len(checked_list(d["nodes"], "nodes")))
    st = fields_from_wire(d, refs)
    fill(st, nodes=[built if (built := fast_read.node(n, k, tensors)) is not None else _node(n, k, refs)
                    for k, n in enumerate(d["nodes"])], edges=_edges(d["edges"], refs.n_nodes))
    for k, e in enumerate(checked_list(d.get("execution") or [], "execution")):
        if not (isinstance(e, list) and len(e) == 2 and type(e[1]) is int and e[1] >= 0):
            raise TraceFormatError(f"execution[{k}]: {e!r} is not [node id, run index]")
        st.execution.append((refs.node(e[0], f"execution[{k}]", False) or 0, e[1]))
    return st


def fields_from_wire(d: dict[str, Any], refs: Refs) -> StepTrace:
    """A `StepTrace` of the step's fields but its nodes, edges and execution order, checked by `checked_fields`
    (NOTE [Fields checked in place]): `refs` holds the tensors they name and the step's node count."""
    f = checked_fields(d, refs)
    tensors = refs.tensors

    def of(ix: list[int | None]) -> list[TensorTrace | None]:
        return [None if i is None else tensors[i] for i in ix]

    modules = {name: ModuleTrace(name=name, type=m["type"], params=m["params"],
                                 calls=[ModuleCall(of(c["gi"]), of(c["go"]), c["in"], c["out"], c["last"])
                                        for c in m["calls"]])
               for name, m in f["modules"].items()}
    passes = [BackwardPass(index=p["index"], api=p["api"], roots=p["roots"], root_grads=of(p["root_grads"]),
                           retain_graph=p["retain_graph"], create_graph=p["create_graph"], start=p["start"],
                           end=p["end"]) for p in f["passes"]]
    return StepTrace(run=f["run"], step=f["step"], modules=modules,
                     params={name: tensors[i] for name, i in f["params"].items()}, passes=passes, meta=f["meta"],
                     error=f["error"], problems=[Problem(**p) for p in f["problems"]], not_in_step=f["not_in_step"],
                     rank=f["rank"], world_size=f["world_size"], trigger=f["trigger"],
                     optimizer_steps=[OptimizerStep(**o) for o in f["optimizer_steps"]])


def _node(n: Any, k: int, refs: Refs) -> NodeTrace:
    w = f"nodes[{k}]"
    n = a_map(n, w)
    if n.get("id") != k or type(n.get("id")) is not int:
        raise TraceFormatError(f"{w}.id: expected {k}, got {n.get('id')!r} (ids are positions)")
    runs = []
    for j, r in enumerate(checked_list(n.get("runs") or [], f"{w}.runs")):
        wr = f"{w}.runs[{j}]"
        if not isinstance(r, list) or len(r) != 5:
            raise TraceFormatError(f"{wr}: expected [pass, order, go, gi, time_us]")
        runs.append(NodeRun(an_int(r[0], f"{wr}.pass"), an_int(r[1], f"{wr}.order"),
                            refs.tensor_list(checked_list(r[2], f"{wr}.go"), f"{wr}.go") or [],
                            refs.tensor_list(r[3], f"{wr}.gi"), opt_num(r[4], f"{wr}.time_us")))
    return NodeTrace(
        id=k, name=a_str(n.get("name"), f"{w}.name"), kind=a_str(n.get("kind", "op"), f"{w}.kind"),
        module=opt_str(n.get("module"), f"{w}.module"), param=opt_str(n.get("param"), f"{w}.param"),
        source=opt_str(n.get("source"), f"{w}.source"), schema=opt_str(n.get("schema"), f"{w}.schema"),
        order=opt_int(n.get("order"), f"{w}.order"),
        input_labels=str_list(n.get("labels"), f"{w}.labels"), input_args=str_list(n.get("args"), f"{w}.args"),
        input_shapes=_shapes(n.get("in_shapes"), f"{w}.in_shapes"),
        output_shapes=_shapes(n.get("out_shapes"), f"{w}.out_shapes"),
        output_dtypes=str_list(n.get("out_dtypes"), f"{w}.out_dtypes", optional=True),
        grad_inputs=refs.tensor_list(n.get("gi"), f"{w}.gi"), grad_outputs=refs.tensor_list(n.get("go"), f"{w}.go"),
        time_us=opt_num(n.get("t"), f"{w}.t"), runs=runs,
    )


def _edges(edges: Any, n_nodes: int) -> list[tuple[int, int, int]]:
    out = []
    for k, e in enumerate(checked_list(edges, "edges")):
        if type(e) is list and len(e) == 3:
            a, b, slot = e
            if type(a) is int and type(b) is int and type(slot) is int and 0 <= a < n_nodes and 0 <= b < n_nodes:
                out.append((a, b, slot))
                continue
        if not (isinstance(e, list) and len(e) == 3 and all(type(x) is int for x in e)) or \
                not (0 <= e[0] < n_nodes and 0 <= e[1] < n_nodes):
            raise TraceFormatError(f"edges[{k}]: {e!r} is not [src, dst, slot] with node ids in 0..{n_nodes - 1}")
        out.append((e[0], e[1], e[2]))
    return out


def _shapes(v: Any, where: str) -> list[tuple[int, ...] | None]:
    out: list[tuple[int, ...] | None] = []
    for k, s in enumerate(checked_list(v or [], where)):
        if s is None:
            out.append(None)
            continue
        if not isinstance(s, list) or not all(type(x) is int and x >= 0 for x in s):
            raise TraceFormatError(f"{where}[{k}]: expected a list of non-negative ints or nil, got {s!r:.80}")
        out.append(tuple(s))
    return out
