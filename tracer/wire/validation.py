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
from gradscape.tracer.wire.types import TensorNumpy, TraceFormatError
from gradscape.tracer.wire.versions import WIRE_VERSION


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
        shape=tuple(shape), dtype=_str(d.get("dtype"), f"{where}.dtype"),
        stats=dict(zip(STAT_NAMES, (float(v) for v in stats))),
        thumb=None if thumb is None else decode_array(thumb, f"{where}.thumb"),
        thumb_view=_str(d.get("view", ""), f"{where}.view"), device=_str(d.get("device", "cpu"), f"{where}.device"),
        values=None if values is None else decode_array(values, f"{where}.values"),
    )


class Refs:
    """Resolves what a step's fields refer to, checking each: tensor indices (positions in the step's
    "tensors": any sequence of them, made when read for a column step) and node ids (positions in its
    "nodes")."""

    def __init__(self, tensors: Sequence[TensorTrace], n_nodes: int) -> None:
        self.tensors, self.n_nodes = tensors, n_nodes

    def tensor(self, i: Any, where: str) -> TensorTrace | None:
        if i is None:
            return None
        if type(i) is not int or not 0 <= i < len(self.tensors):
            raise TraceFormatError(f"{where}: tensor index {i!r} out of range (0..{len(self.tensors) - 1})")
        return self.tensors[i]

    def tensor_list(self, ix: Any, where: str) -> list[TensorTrace | None] | None:
        return None if ix is None else [self.tensor(i, f"{where}[{k}]") for k, i in enumerate(checked_list(ix, where))]

    def node(self, i: Any, where: str, optional: bool = True) -> int | None:
        if i is None and optional:
            return None
        if type(i) is not int or not 0 <= i < self.n_nodes:
            raise TraceFormatError(f"{where}: {i!r} is not a node id in 0..{self.n_nodes - 1}")
        return i


@collector_paused()  # NOTE [Collector paused] in tracer/collector.py
def step_from_wire(d: Any, arrays: dict[int, TensorNumpy] | None = None) -> StepTrace:
    """Rebuild a `StepTrace`; raises `TraceFormatError` naming the first field that is wrong. `arrays`: the
    (thumbnail, values) of tensors by index, already read as arrays (`TraceStore.read_step`, which keeps
    them apart from the graph), set on the tensors built."""
    d = _versioned(d)
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


def _versioned(d: Any) -> dict[str, Any]:
    """`d`, a map of this reader's wire version, else `TraceFormatError`."""
    if not isinstance(d, dict):
        raise TraceFormatError(f"step: expected a map, got {type(d).__name__}")
    v = d.get("v")
    if type(v) is not int or v != WIRE_VERSION:
        raise TraceFormatError(f"step: wire version {v!r} is not supported (this reader: {WIRE_VERSION})")
    return d


def fields_from_wire(d: dict[str, Any], refs: Refs) -> StepTrace:
    """A `StepTrace` of the step's fields but its nodes, edges and execution order, each checked: `refs`
    resolves the tensors and node ids they name (`tracer.wire.column_check` gives its own)."""
    d = _versioned(d)
    for key in ("run", "step"):
        if key not in d:
            raise TraceFormatError(f"step: missing field {key!r}")
    run, step = _str(d["run"], "run"), _int(d["step"], "step")
    error = opt_str(d.get("error"), "error")
    meta = plain(_map(d.get("meta") or {}, "meta"), "meta")
    modules = {name: _module(name, m, refs) for name, m in _map(d.get("modules") or {}, "modules").items()}
    params = {}
    for name, i in _map(d.get("params") or {}, "params").items():
        t = refs.tensor(i, f"params[{_str(name, f'params: key {name!r}')!r}]")
        if t is not None:
            params[name] = t
    passes = [_pass(p, k, refs) for k, p in enumerate(checked_list(d.get("passes") or [], "passes"))]
    problems = [_problem(p, k, refs) for k, p in enumerate(checked_list(d.get("problems") or [], "problems"))]
    not_in_step = [_str(p, f"not_in_step[{k}]") for k, p in enumerate(checked_list(d.get("not_in_step") or [],
                                                                          "not_in_step"))]
    rank, world_size = (None if d.get(key) is None else _int(d[key], key) for key in ("rank", "world_size"))
    trigger = opt_str(d.get("trigger"), "trigger")
    return StepTrace(run=run, step=step, modules=modules, params=params, passes=passes, meta=meta, error=error,
                     problems=problems, not_in_step=not_in_step, rank=rank, world_size=world_size, trigger=trigger,
                     optimizer_steps=[optimizer_step_from_wire(o, f"optimizer_steps[{k}]")
                                      for k, o in enumerate(checked_list(d.get("optimizer_steps") or [],
                                                                         "optimizer_steps"))])


def optimizer_step_from_wire(d: Any, where: str) -> OptimizerStep:
    d = _map(d, where)
    lr = checked_list(d.get("lr") or [], f"{where}.lr")
    return OptimizerStep(optimizer=_str(d.get("optimizer"), f"{where}.optimizer"),
                         params=str_list(d.get("params"), f"{where}.params"),
                         lr=[_num(x, f"{where}.lr[{k}]") for k, x in enumerate(lr)],
                         scale=_opt_num(d.get("scale"), f"{where}.scale"),
                         skipped=_bool(d.get("skipped", False), f"{where}.skipped"),
                         grad_norm=_opt_num(d.get("grad_norm"), f"{where}.grad_norm"),
                         grad_norm_before_clip=_opt_num(d.get("grad_norm_before_clip"),
                                                        f"{where}.grad_norm_before_clip"))


def _node(n: Any, k: int, refs: Refs) -> NodeTrace:
    w = f"nodes[{k}]"
    n = _map(n, w)
    if n.get("id") != k or type(n.get("id")) is not int:
        raise TraceFormatError(f"{w}.id: expected {k}, got {n.get('id')!r} (ids are positions)")
    runs = []
    for j, r in enumerate(checked_list(n.get("runs") or [], f"{w}.runs")):
        wr = f"{w}.runs[{j}]"
        if not isinstance(r, list) or len(r) != 5:
            raise TraceFormatError(f"{wr}: expected [pass, order, go, gi, time_us]")
        runs.append(NodeRun(_int(r[0], f"{wr}.pass"), _int(r[1], f"{wr}.order"),
                            refs.tensor_list(checked_list(r[2], f"{wr}.go"), f"{wr}.go") or [],
                            refs.tensor_list(r[3], f"{wr}.gi"), _opt_num(r[4], f"{wr}.time_us")))
    return NodeTrace(
        id=k, name=_str(n.get("name"), f"{w}.name"), kind=_str(n.get("kind", "op"), f"{w}.kind"),
        module=opt_str(n.get("module"), f"{w}.module"), param=opt_str(n.get("param"), f"{w}.param"),
        source=opt_str(n.get("source"), f"{w}.source"), schema=opt_str(n.get("schema"), f"{w}.schema"),
        order=_opt_int(n.get("order"), f"{w}.order"),
        input_labels=str_list(n.get("labels"), f"{w}.labels"), input_args=str_list(n.get("args"), f"{w}.args"),
        input_shapes=_shapes(n.get("in_shapes"), f"{w}.in_shapes"),
        output_shapes=_shapes(n.get("out_shapes"), f"{w}.out_shapes"),
        output_dtypes=str_list(n.get("out_dtypes"), f"{w}.out_dtypes", optional=True),
        grad_inputs=refs.tensor_list(n.get("gi"), f"{w}.gi"), grad_outputs=refs.tensor_list(n.get("go"), f"{w}.go"),
        time_us=_opt_num(n.get("t"), f"{w}.t"), runs=runs,
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


def _module(name: Any, m: Any, refs: Refs) -> ModuleTrace:
    w = f"modules[{name!r}]"
    _str(name, f"modules: key {name!r}")
    m = _map(m, w)
    calls = []
    for j, c in enumerate(checked_list(m.get("calls") or [], f"{w}.calls")):
        wc = f"{w}.calls[{j}]"
        c = _map(c, wc)
        calls.append(ModuleCall(refs.tensor_list(c.get("gi"), f"{wc}.gi") or [],
                                refs.tensor_list(c.get("go"), f"{wc}.go") or [],
                                [refs.node(x, f"{wc}.in") for x in checked_list(c.get("in") or [], f"{wc}.in")],
                                [refs.node(x, f"{wc}.out") for x in checked_list(c.get("out") or [], f"{wc}.out")],
                                refs.node(c.get("last"), f"{wc}.last")))
    return ModuleTrace(name=name, type=_str(m.get("type", ""), f"{w}.type"),
                       params=str_list(m.get("params"), f"{w}.params"), calls=calls)


def _pass(p: Any, k: int, refs: Refs) -> BackwardPass:
    w = f"passes[{k}]"
    p = _map(p, w)
    return BackwardPass(
        index=_int(p.get("index"), f"{w}.index"), api=_str(p.get("api"), f"{w}.api"),
        roots=[x for x in (refs.node(r, f"{w}.roots", False) for r in checked_list(p.get("roots"), f"{w}.roots"))
               if x is not None],
        root_grads=refs.tensor_list(p.get("root_grads"), f"{w}.root_grads") or [],
        retain_graph=_bool(p.get("retain_graph", False), f"{w}.retain_graph"),
        create_graph=_bool(p.get("create_graph", False), f"{w}.create_graph"),
        start=_int(p.get("start", 0), f"{w}.start"), end=_int(p.get("end", 0), f"{w}.end"))


def _problem(p: Any, k: int, refs: Refs) -> Problem:
    w = f"problems[{k}]"
    p = _map(p, w)
    return Problem(kind=_str(p.get("kind"), f"{w}.kind"), message=_str(p.get("message"), f"{w}.message"),
                   node=refs.node(p.get("node"), f"{w}.node"), param=opt_str(p.get("param"), f"{w}.param"),
                   source=opt_str(p.get("source"), f"{w}.source"))


# ---------------------------------------------------------------------- field checks
_INT64 = (-(1 << 63), (1 << 63) - 1)


def plain(v: Any, where: str, depth: int = 0) -> Any:
    """`meta`: what JSON can say (maps with string keys, lists, strings, numbers, booleans, nil)."""
    if depth > 32:
        raise TraceFormatError(f"{where}: nested more than 32 levels")
    if v is None or type(v) in (str, int, float, bool):
        return v
    if isinstance(v, (str, int, float)):  # subclasses (torch's version string) as their plain type
        return bool(v) if isinstance(v, bool) else str(v) if isinstance(v, str) else int(v) if isinstance(
            v, int) else float(v)
    if isinstance(v, list):
        return [plain(x, f"{where}[{k}]", depth + 1) for k, x in enumerate(v)]
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise TraceFormatError(f"{where}: key {k!r:.40} is not a string")
        return {k: plain(x, f"{where}.{k}", depth + 1) for k, x in v.items()}
    raise TraceFormatError(f"{where}: {type(v).__name__} is not allowed (strings, numbers, lists and maps only)")


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise TraceFormatError(f"{where}: expected a string, got {type(v).__name__}")
    return v


def opt_str(v: Any, where: str) -> str | None:
    return None if v is None else _str(v, where)


def checked_list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise TraceFormatError(f"{where}: expected a list, got {type(v).__name__}")
    return v


def _map(v: Any, where: str) -> dict[Any, Any]:
    if not isinstance(v, dict):
        raise TraceFormatError(f"{where}: expected a map, got {type(v).__name__}")
    return v


def _int(v: Any, where: str) -> int:
    """An int that SQLite can hold (a bigger one would fail only when stored)."""
    if type(v) is not int:
        raise TraceFormatError(f"{where}: expected an int, got {type(v).__name__}")
    if not _INT64[0] <= v <= _INT64[1]:
        raise TraceFormatError(f"{where}: {v} is outside the 64-bit integer range")
    return v


def _opt_int(v: Any, where: str) -> int | None:
    return None if v is None else _int(v, where)


def _opt_num(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if type(v) not in (int, float):
        raise TraceFormatError(f"{where}: expected a number or nil, got {type(v).__name__}")
    return float(v)


def _num(v: Any, where: str) -> float:
    if type(v) not in (int, float):
        raise TraceFormatError(f"{where}: expected a number, got {type(v).__name__}")
    return float(v)


def _bool(v: Any, where: str) -> bool:
    if type(v) is not bool:
        raise TraceFormatError(f"{where}: expected true or false, got {type(v).__name__}")
    return v


def str_list(v: Any, where: str, optional: bool = False) -> list[Any]:
    out = checked_list(v or [], where)
    for k, x in enumerate(out):
        if not (isinstance(x, str) or (optional and x is None)):
            raise TraceFormatError(f"{where}[{k}]: expected a string, got {type(x).__name__}")
    return list(out)


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
