"""The wire and disk form of a `StepTrace`: plain msgpack maps, arrays as raw little-endian bytes.

No pickle anywhere: a trace is data (`dict`/`list`/`str`/numbers/`bytes`), never code.

Wire form, version `WIRE_VERSION` (every key is always present):
    {"v": 1, "run": str, "step": int, "error": str|None, "meta": {...},
     "tensors": [T, ...],                      # each distinct TensorTrace once; others refer by index
     "nodes": [{"id", "name", "kind", "module", "param", "source", "schema", "order",
                "labels": [str], "args": [str], "in_shapes": [[int]|None], "out_shapes": [[int]|None],
                "out_dtypes": [str|None], "gi": [int|None]|None, "go": [int|None]|None, "t": float|None,
                "runs": [[pass, order, go, gi, t], ...]}],
     "edges": [[src, dst, slot], ...],
     "modules": {name: {"type", "params": [str], "calls": [{"gi", "go", "in", "out", "last"}]}},
     "params": {name: int}, "passes": [{...}], "execution": [[node, run], ...]}
    T = {"shape": [int], "dtype": str, "stats": [min, max, mean, std, norm, nan, inf, zeros],
         "view": str, "device": str, "thumb": A|None, "values": A|None}
    A = {"dtype": "<f4"|"<f8"|..., "shape": [int], "data": bytes}
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from tracer._model import (
    STAT_NAMES,
    BackwardPass,
    ModuleCall,
    ModuleTrace,
    NodeRun,
    NodeTrace,
    Problem,
    StepTrace,
    TensorTrace,
)

WIRE_VERSION = 1
_ALLOWED_DTYPES = {"<f2", "<f4", "<f8", "|u1", "|i1", "<i4", "<i8", "|b1"}
MAX_ARRAY_ELEMENTS = 1 << 28


class TraceFormatError(ValueError):
    """A trace (from the wire or a file) is malformed; the message names what is wrong."""


# ---------------------------------------------------------------------- arrays
def encode_array(a: np.ndarray) -> dict[str, Any]:
    a = np.asarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    if a.dtype.str not in _ALLOWED_DTYPES:
        raise TraceFormatError(f"array dtype {a.dtype} cannot be stored (allowed: {sorted(_ALLOWED_DTYPES)})")
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.tobytes(order="C")}


def decode_array(d: Any, where: str = "array") -> np.ndarray:
    if not isinstance(d, dict):
        raise TraceFormatError(f"{where}: expected a map with dtype/shape/data, got {type(d).__name__}")
    dtype, shape, data = d.get("dtype"), d.get("shape"), d.get("data")
    if dtype not in _ALLOWED_DTYPES:
        raise TraceFormatError(f"{where}: dtype {dtype!r} is not one of {sorted(_ALLOWED_DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
        raise TraceFormatError(f"{where}: shape must be a list of ints, got {shape!r}")
    if any(s < 0 for s in shape):
        raise TraceFormatError(f"{where}: negative dimension in shape {shape}")
    n = 1
    for s in shape:
        n *= s
    if n > MAX_ARRAY_ELEMENTS:
        raise TraceFormatError(f"{where}: shape {shape} has {n} elements, more than {MAX_ARRAY_ELEMENTS}")
    if not isinstance(data, (bytes, bytearray)):
        raise TraceFormatError(f"{where}: data must be bytes, got {type(data).__name__}")
    dt = np.dtype(dtype)
    if len(data) != n * dt.itemsize:
        raise TraceFormatError(f"{where}: {len(data)} bytes of data but shape {shape} × {dtype} needs "
                               f"{n * dt.itemsize}")
    return np.frombuffer(bytes(data), dtype=dt).reshape(shape)


# ---------------------------------------------------------------------- tensors
class _TensorTable:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._index: dict[int, int] = {}

    def ref(self, t: TensorTrace | None) -> int | None:
        if t is None:
            return None
        k = id(t)
        if k not in self._index:
            self._index[k] = len(self.items)
            self.items.append(tensor_to_wire(t))
        return self._index[k]

    def refs(self, ts: list[TensorTrace | None] | None) -> list[int | None] | None:
        return None if ts is None else [self.ref(t) for t in ts]


def tensor_to_wire(t: TensorTrace) -> dict[str, Any]:
    return {"shape": list(t.shape), "dtype": t.dtype,
            "stats": [float(t.stats.get(k, float("nan"))) for k in STAT_NAMES],
            "view": t.thumb_view, "device": t.device,
            "thumb": None if t.thumb is None else encode_array(t.thumb),
            "values": None if t.values is None else encode_array(t.values)}


def tensor_from_wire(d: dict[str, Any], where: str = "tensor") -> TensorTrace:
    if not isinstance(d, dict):
        raise TraceFormatError(f"{where}: expected a map, got {type(d).__name__}")
    shape = d.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise TraceFormatError(f"{where}.shape: expected a list of non-negative ints, got {shape!r}")
    stats = d.get("stats")
    if not isinstance(stats, list) or len(stats) != len(STAT_NAMES) or \
            not all(isinstance(v, (int, float)) for v in stats):
        raise TraceFormatError(f"{where}.stats: expected {len(STAT_NAMES)} numbers ({' '.join(STAT_NAMES)})")
    thumb = d.get("thumb")
    values = d.get("values")
    return TensorTrace(
        shape=tuple(shape), dtype=_str(d.get("dtype"), f"{where}.dtype"),
        stats=dict(zip(STAT_NAMES, (float(v) for v in stats))),
        thumb=None if thumb is None else decode_array(thumb, f"{where}.thumb"),
        thumb_view=_str(d.get("view", ""), f"{where}.view"), device=_str(d.get("device", "cpu"), f"{where}.device"),
        values=None if values is None else decode_array(values, f"{where}.values"),
    )


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise TraceFormatError(f"{where}: expected a string, got {type(v).__name__}")
    return v


# ---------------------------------------------------------------------- steps
def step_to_wire(st: StepTrace) -> dict[str, Any]:
    tab = _TensorTable()
    nodes = []
    for n in st.nodes:
        nodes.append({
            "id": n.id, "name": n.name, "kind": n.kind, "module": n.module, "param": n.param,
            "source": n.source, "schema": n.schema, "order": n.order,
            "labels": list(n.input_labels), "args": list(n.input_args),
            "in_shapes": [None if s is None else list(s) for s in n.input_shapes],
            "out_shapes": [None if s is None else list(s) for s in n.output_shapes],
            "out_dtypes": list(n.output_dtypes),
            "gi": tab.refs(n.grad_inputs), "go": tab.refs(n.grad_outputs), "t": n.time_us,
            "runs": [[r.pass_index, r.order, tab.refs(r.grad_outputs), tab.refs(r.grad_inputs), r.time_us]
                     for r in n.runs],
        })
    modules = {name: {"type": m.type, "params": list(m.params),
                      "calls": [{"gi": tab.refs(c.grad_input), "go": tab.refs(c.grad_output),
                                 "in": list(c.input_nodes), "out": list(c.output_nodes), "last": c.last_op}
                                for c in m.calls]}
               for name, m in st.modules.items()}
    passes = [{"index": p.index, "api": p.api, "roots": list(p.roots), "root_grads": tab.refs(p.root_grads),
               "retain_graph": p.retain_graph, "create_graph": p.create_graph, "start": p.start, "end": p.end}
              for p in st.passes]
    return {"v": WIRE_VERSION, "run": st.run, "step": st.step, "error": st.error, "meta": dict(st.meta),
            "nodes": nodes, "edges": [list(e) for e in st.edges], "modules": modules,
            "params": {k: tab.ref(v) for k, v in st.params.items()}, "passes": passes,
            "execution": [list(e) for e in st.execution], "tensors": tab.items,
            "problems": [{"kind": p.kind, "message": p.message, "node": p.node, "param": p.param,
                          "source": p.source} for p in st.problems],
            "rank": st.rank, "world_size": st.world_size}


def step_from_wire(d: Any) -> StepTrace:
    """Rebuild a `StepTrace`; raises `TraceFormatError` naming the first problem found."""
    if not isinstance(d, dict):
        raise TraceFormatError(f"step: expected a map, got {type(d).__name__}")
    if d.get("v") != WIRE_VERSION:
        raise TraceFormatError(f"step: wire version {d.get('v')!r} is not supported (this reader: {WIRE_VERSION})")
    for key in ("run", "step", "nodes", "edges", "tensors"):
        if key not in d:
            raise TraceFormatError(f"step: missing field {key!r}")
    tensors = [tensor_from_wire(t, f"tensors[{i}]") for i, t in enumerate(_list(d["tensors"], "tensors"))]

    def get(i: Any, where: str) -> TensorTrace | None:
        if i is None:
            return None
        if not isinstance(i, int) or not 0 <= i < len(tensors):
            raise TraceFormatError(f"{where}: tensor index {i!r} out of range (0..{len(tensors) - 1})")
        return tensors[i]

    def gets(ix: Any, where: str) -> list[TensorTrace | None] | None:
        return None if ix is None else [get(i, where) for i in _list(ix, where)]

    st = StepTrace(run=_str(d["run"], "run"), step=_int(d["step"], "step"))
    st.error = d.get("error")
    st.meta = dict(d.get("meta") or {})
    for k, n in enumerate(_list(d["nodes"], "nodes")):
        w = f"nodes[{k}]"
        if not isinstance(n, dict):
            raise TraceFormatError(f"{w}: expected a map")
        if n.get("id") != k:
            raise TraceFormatError(f"{w}.id: expected {k}, got {n.get('id')!r} (ids are positions)")
        st.nodes.append(NodeTrace(
            id=k, name=_str(n.get("name"), f"{w}.name"), kind=_str(n.get("kind", "op"), f"{w}.kind"),
            module=n.get("module"), param=n.get("param"), source=n.get("source"), schema=n.get("schema"),
            order=n.get("order"), input_labels=list(n.get("labels") or []), input_args=list(n.get("args") or []),
            input_shapes=[None if s is None else tuple(s) for s in n.get("in_shapes") or []],
            output_shapes=[None if s is None else tuple(s) for s in n.get("out_shapes") or []],
            output_dtypes=list(n.get("out_dtypes") or []),
            grad_inputs=gets(n.get("gi"), f"{w}.gi"), grad_outputs=gets(n.get("go"), f"{w}.go"),
            time_us=n.get("t"),
            runs=[NodeRun(r[0], r[1], gets(r[2], f"{w}.runs") or [], gets(r[3], f"{w}.runs"), r[4])
                  for r in n.get("runs") or []],
        ))
    n_nodes = len(st.nodes)
    for e in _list(d["edges"], "edges"):
        if not (isinstance(e, list) and len(e) == 3 and all(isinstance(x, int) for x in e)) or \
                not (0 <= e[0] < n_nodes and 0 <= e[1] < n_nodes):
            raise TraceFormatError(f"edges: {e!r} is not [src, dst, slot] with node ids in 0..{n_nodes - 1}")
        st.edges.append((e[0], e[1], e[2]))
    for name, m in (d.get("modules") or {}).items():
        st.modules[name] = ModuleTrace(name=name, type=m.get("type", ""), params=list(m.get("params") or []),
                                       calls=[ModuleCall(gets(c.get("gi"), f"modules.{name}") or [],
                                                         gets(c.get("go"), f"modules.{name}") or [],
                                                         list(c.get("in") or []), list(c.get("out") or []),
                                                         c.get("last")) for c in m.get("calls") or []])
    for name, i in (d.get("params") or {}).items():
        t = get(i, f"params.{name}")
        if t is not None:
            st.params[name] = t
    for p in d.get("passes") or []:
        st.passes.append(BackwardPass(index=p["index"], api=p["api"], roots=list(p["roots"]),
                                      root_grads=gets(p.get("root_grads"), "passes") or [],
                                      retain_graph=bool(p.get("retain_graph")),
                                      create_graph=bool(p.get("create_graph")), start=p.get("start", 0),
                                      end=p.get("end", 0)))
    st.execution = [(int(a), int(b)) for a, b in d.get("execution") or []]
    for k, p in enumerate(_list(d.get("problems") or [], "problems")):
        w = f"problems[{k}]"
        if not isinstance(p, dict):
            raise TraceFormatError(f"{w}: expected a map")
        node = p.get("node")
        if node is not None and (not isinstance(node, int) or not 0 <= node < n_nodes):
            raise TraceFormatError(f"{w}.node: {node!r} is not a node id in 0..{n_nodes - 1}")
        st.problems.append(Problem(kind=_str(p.get("kind"), f"{w}.kind"),
                                   message=_str(p.get("message"), f"{w}.message"), node=node,
                                   param=_opt_str(p.get("param"), f"{w}.param"),
                                   source=_opt_str(p.get("source"), f"{w}.source")))
    for key in ("rank", "world_size"):
        v = d.get(key)
        if v is not None:
            setattr(st, key, _int(v, key))
    return st


def _opt_str(v: Any, where: str) -> str | None:
    return None if v is None else _str(v, where)


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise TraceFormatError(f"{where}: expected a list, got {type(v).__name__}")
    return v


def _int(v: Any, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TraceFormatError(f"{where}: expected an int, got {type(v).__name__}")
    return v


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise TraceFormatError(f"not a msgpack document: {exc}") from exc
