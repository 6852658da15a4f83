"""The serialised step, defined once: what the tracer sends, the server checks, the store keeps and the
API and the view read. Plain msgpack maps, arrays as raw little-endian bytes.

No pickle anywhere: a trace is data (`dict`/`list`/`str`/numbers/`bytes`), never code. `step_from_wire`
checks every field and raises `TraceFormatError` naming the first one that is wrong (nothing else
escapes it, whatever the input: tests/test_wire.py drives random mutations of real steps through it).

Wire form, version `WIRE_VERSION` (every key is always present):
    {"v": 1, "run": str, "step": int, "error": str|None, "meta": {...},
     "tensors": [T, ...],                      # each distinct TensorTrace once; others refer by index
     "nodes": [{"id", "name", "kind", "module", "param", "source", "schema", "order",
                "labels": [str], "args": [str], "in_shapes": [[int]|None], "out_shapes": [[int]|None],
                "out_dtypes": [str|None], "gi": [int|None]|None, "go": [int|None]|None, "t": float|None,
                "runs": [[pass, order, go, gi, t], ...]}],
     "edges": [[src, dst, slot], ...],
     "modules": {name: {"type", "params": [str], "calls": [{"gi", "go", "in", "out", "last"}]}},
     "params": {name: int}, "passes": [{"index", "api", "roots", "root_grads", "retain_graph",
                                       "create_graph", "start", "end"}], "execution": [[node, run], ...],
     "problems": [{"kind", "message", "node", "param", "source"}], "rank": int|None, "world_size": int|None,
     "trigger": str|None, "optimizer_steps": [{"optimizer", "params", "lr", "scale", "skipped", "grad_norm",
                                               "grad_norm_before_clip"}]}
    Node fields hold node ids (positions in "nodes") and tensor indices (positions in "tensors").
    T = {"shape": [int], "dtype": str, "stats": [min, max, mean, std, norm, nan, inf, zeros],
         "view": str, "device": str, "thumb": A|None, "values": A|None}
    A = {"dtype": "<f4"|"<f8"|..., "shape": [int], "data": bytes}
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, TypedDict, cast

import msgpack
import numpy as np

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
)

WIRE_VERSION = 1
_ALLOWED_DTYPES = {"<f2", "<f4", "<f8", "|u1", "|i1", "<i4", "<i8", "|b1"}
MAX_ARRAY_ELEMENTS = 1 << 28


class TraceFormatError(ValueError):
    """A trace (from the wire or a file) is malformed; the message names what is wrong."""


# ---------------------------------------------------------------------- typed structures
# The wire form above, as types: the codec builds these, `step_from_wire` checks them, the store
# keeps them, and the JSON API and the view read them. They are plain dicts and lists at run time
# (msgpack gives nothing else); the types let mypy check every key the readers use against this one
# definition, so a renamed or misspelt field fails `make lint` instead of reading None.
class WireArray(TypedDict):
    dtype: str
    shape: list[int]
    data: bytes


class _WireTensorBase(TypedDict):
    shape: list[int]
    dtype: str
    stats: list[float]  # STAT_NAMES order
    view: str
    device: str


class WireTensor(_WireTensorBase, total=False):
    """A tensor's summary. `thumb` and `values` are present on the wire and in a step read whole
    from the store; the store's graph form (`TraceStore.read_graph`) leaves them out."""
    thumb: WireArray | None
    values: WireArray | None


class TensorArrays(TypedDict):
    """A tensor's arrays alone: how the store keeps them, apart from the graph, so a view that
    needs one node's heatmaps reads only those (`TraceStore.read_arrays`)."""
    thumb: WireArray | None
    values: WireArray | None


TensorRefs = list[int | None]  # positions in WireStep["tensors"], None for a slot without a gradient


class WireRun(NamedTuple):
    """One run of a node (a node runs once per backward pass that reaches it). On the wire a run is
    the list `[pass, order, go, gi, t]`; read it with `node_runs`, never by position."""
    pass_index: int
    order: int
    go: TensorRefs
    gi: TensorRefs | None
    time_us: float | None


class WireNode(TypedDict):
    id: int
    name: str
    kind: str
    module: str | None
    param: str | None
    source: str | None
    schema: str | None
    order: int | None
    labels: list[str]
    args: list[str]
    in_shapes: list[list[int] | None]
    out_shapes: list[list[int] | None]
    out_dtypes: list[str | None]
    gi: TensorRefs | None  # ∂L/∂inputs, sent on (None when the node's hook did not see them)
    go: TensorRefs | None  # ∂L/∂outputs, arriving
    t: float | None
    runs: list[list[Any]]  # each a WireRun's fields, in order


# "in" is a Python keyword, hence the functional form
WireCall = TypedDict("WireCall", {"gi": TensorRefs, "go": TensorRefs, "in": list[int | None],
                                  "out": list[int | None], "last": int | None})


class WireModule(TypedDict):
    type: str
    params: list[str]
    calls: list[WireCall]


class WirePass(TypedDict):
    index: int
    api: str
    roots: list[int]
    root_grads: TensorRefs
    retain_graph: bool
    create_graph: bool
    start: int
    end: int


class WireProblem(TypedDict):
    kind: str
    message: str
    node: int | None
    param: str | None
    source: str | None


class WireOptimizerStep(TypedDict):
    """One `OptimizerStep` (tracer/_model.py): an optimizer step the monitor saw in the block."""
    optimizer: str
    params: list[str]
    lr: list[float]
    scale: float | None
    skipped: bool
    grad_norm: float | None
    grad_norm_before_clip: float | None


class WireStep(TypedDict):
    v: int
    run: str
    step: int
    error: str | None
    meta: dict[str, Any]
    nodes: list[WireNode]
    edges: list[list[int]]  # [src, dst, slot]
    modules: dict[str, WireModule]
    params: dict[str, int | None]
    passes: list[WirePass]
    execution: list[list[int]]  # [node id, run index]
    tensors: list[WireTensor]
    problems: list[WireProblem]
    rank: int | None
    world_size: int | None
    trigger: str | None  # monitor: why an unscheduled step was traced
    optimizer_steps: list[WireOptimizerStep]


# What `step_from_wire` takes a missing field to mean. Files written by an earlier release of the same
# wire version can lack fields added since (`problems`, `rank`, `world_size`); `with_defaults` fills
# them in so that every reader can index every key of the types above.
_STEP_DEFAULTS: dict[str, Any] = {"error": None, "meta": dict, "modules": dict, "params": dict, "passes": list,
                                  "execution": list, "problems": list, "rank": None, "world_size": None,
                                  "trigger": None, "optimizer_steps": list}
_NODE_DEFAULTS: dict[str, Any] = {"kind": "op", "module": None, "param": None, "source": None, "schema": None,
                                  "order": None, "labels": list, "args": list, "in_shapes": list, "out_shapes": list,
                                  "out_dtypes": list, "gi": None, "go": None, "t": None, "runs": list}
_TENSOR_DEFAULTS: dict[str, Any] = {"view": "", "device": "cpu"}
_MODULE_DEFAULTS: dict[str, Any] = {"type": "", "params": list, "calls": list}


def _fill(d: dict[str, Any], defaults: dict[str, Any]) -> None:
    for k, v in defaults.items():
        if k not in d:
            d[k] = v() if isinstance(v, type) else v


def with_defaults(d: dict[str, Any]) -> WireStep:
    """A step as stored (checked when it was written, `TraceStore.read_graph`), with every field an
    earlier writer left out set to what `step_from_wire` takes its absence to mean. In place; cheap
    when nothing is missing (one look at the first node, tensor and module)."""
    _fill(d, _STEP_DEFAULTS)
    for items, defaults in ((d.get("nodes") or [], _NODE_DEFAULTS), (d.get("tensors") or [], _TENSOR_DEFAULTS),
                            (list(d["modules"].values()), _MODULE_DEFAULTS)):
        if items and not all(k in items[0] for k in defaults):
            for x in items:
                _fill(x, defaults)
    return cast(WireStep, d)  # every WireStep key is now present


def node_runs(node: WireNode) -> list[WireRun]:
    """A node's runs, named (the wire keeps each as a short list)."""
    return [WireRun(*r) for r in node.get("runs") or ()]


# ---------------------------------------------------------------------- thumbnails
# The 2-D view a thumbnail shows (NOTE [Thumbnail views] in tracer/_summary.py): the tracer draws
# thumbnails with it and the view titles heatmaps with it, so it lives with the schema.
def matrix_shape(shape: tuple[int, ...] | list[int]) -> tuple[int, int]:
    """(rows, cols) of the 2-D view of every rank but 4 (NOTE [Thumbnail views]): a scalar is 1×1,
    a vector a 1×n strip, anything else the leading dimensions flattened against the last."""
    r = len(shape)
    rows = 1 if r <= 1 else math.prod(shape[:-1])
    cols = 1 if r == 0 else int(shape[-1])
    return rows, cols


def thumbnail_view(shape: tuple[int, ...]) -> str:
    """Words for the 2-D view a thumbnail of this shape shows. See NOTE [Thumbnail views]."""
    r = len(shape)
    if r == 0:
        return "scalar"
    if r == 1:
        return f"strip 1×{shape[0]}"
    if r == 2:
        return f"rows {shape[0]} × cols {shape[1]}"
    if r == 3:
        return f"rows {shape[0]}·{shape[1]} (dim0·dim1) × cols {shape[2]}"
    if r == 4:
        return f"sample 0 of {shape[0]}: {shape[1]} channels as tiles of {shape[2]}×{shape[3]}"
    return f"rows {'·'.join(map(str, shape[:-1]))} × cols {shape[-1]}"


# ---------------------------------------------------------------------- arrays
def encode_array(a: np.ndarray) -> WireArray:
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
    if not isinstance(dtype, str) or dtype not in _ALLOWED_DTYPES:
        raise TraceFormatError(f"{where}: dtype {dtype!r} is not one of {sorted(_ALLOWED_DTYPES)}")
    if not isinstance(shape, list) or not all(type(s) is int for s in shape):
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
        self.items: list[WireTensor] = []
        self._index: dict[int, int] = {}

    def ref(self, t: TensorTrace | None) -> int | None:
        if t is None:
            return None
        k = id(t)
        if k not in self._index:
            self._index[k] = len(self.items)
            self.items.append(tensor_to_wire(t))
        return self._index[k]

    def refs(self, ts: list[TensorTrace | None] | None) -> TensorRefs | None:
        return None if ts is None else [self.ref(t) for t in ts]

    def refs_all(self, ts: list[TensorTrace | None]) -> TensorRefs:
        return [self.ref(t) for t in ts]


def tensor_to_wire(t: TensorTrace) -> WireTensor:
    return {"shape": list(t.shape), "dtype": t.dtype,
            "stats": [float(t.stats.get(k, float("nan"))) for k in STAT_NAMES],
            "view": t.thumb_view, "device": t.device,
            "thumb": None if t.thumb is None else encode_array(t.thumb),
            "values": None if t.values is None else encode_array(t.values)}


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


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise TraceFormatError(f"{where}: expected a string, got {type(v).__name__}")
    return v


# ---------------------------------------------------------------------- steps
def step_to_wire(st: StepTrace) -> WireStep:
    tab = _TensorTable()
    nodes: list[WireNode] = []
    for n in st.nodes:
        nodes.append({
            "id": n.id, "name": n.name, "kind": n.kind, "module": n.module, "param": n.param,
            "source": n.source, "schema": n.schema, "order": n.order,
            "labels": list(n.input_labels), "args": list(n.input_args),
            "in_shapes": [None if s is None else list(s) for s in n.input_shapes],
            "out_shapes": [None if s is None else list(s) for s in n.output_shapes],
            "out_dtypes": list(n.output_dtypes),
            "gi": tab.refs(n.grad_inputs), "go": tab.refs(n.grad_outputs), "t": n.time_us,
            "runs": [list(WireRun(r.pass_index, r.order, tab.refs_all(r.grad_outputs), tab.refs(r.grad_inputs),
                                  r.time_us)) for r in n.runs],
        })
    modules: dict[str, WireModule] = {name: {"type": m.type, "params": list(m.params),
                      "calls": [{"gi": tab.refs_all(c.grad_input), "go": tab.refs_all(c.grad_output),
                                 "in": list(c.input_nodes), "out": list(c.output_nodes), "last": c.last_op}
                                for c in m.calls]}
               for name, m in st.modules.items()}
    passes: list[WirePass] = [{"index": p.index, "api": p.api, "roots": list(p.roots),
               "root_grads": tab.refs_all(p.root_grads),
               "retain_graph": p.retain_graph, "create_graph": p.create_graph, "start": p.start, "end": p.end}
              for p in st.passes]
    return {"v": WIRE_VERSION, "run": st.run, "step": st.step, "error": st.error, "meta": _plain(st.meta, "meta"),
            "nodes": nodes, "edges": [list(e) for e in st.edges], "modules": modules,
            "params": {k: tab.ref(v) for k, v in st.params.items()}, "passes": passes,
            "execution": [list(e) for e in st.execution], "tensors": tab.items,
            "problems": [{"kind": p.kind, "message": p.message, "node": p.node, "param": p.param,
                          "source": p.source} for p in st.problems],
            "rank": st.rank, "world_size": st.world_size, "trigger": st.trigger,
            "optimizer_steps": [optimizer_step_to_wire(o) for o in st.optimizer_steps]}


def step_from_wire(d: Any) -> StepTrace:
    """Rebuild a `StepTrace`; raises `TraceFormatError` naming the first field that is wrong."""
    if not isinstance(d, dict):
        raise TraceFormatError(f"step: expected a map, got {type(d).__name__}")
    v = d.get("v")
    if type(v) is not int or v != WIRE_VERSION:
        raise TraceFormatError(f"step: wire version {v!r} is not supported (this reader: {WIRE_VERSION})")
    for key in ("run", "step", "nodes", "edges", "tensors"):
        if key not in d:
            raise TraceFormatError(f"step: missing field {key!r}")
    tensors = [tensor_from_wire(t, f"tensors[{i}]") for i, t in enumerate(_list(d["tensors"], "tensors"))]
    n_nodes = len(_list(d["nodes"], "nodes"))

    def get(i: Any, where: str) -> TensorTrace | None:
        if i is None:
            return None
        if type(i) is not int or not 0 <= i < len(tensors):
            raise TraceFormatError(f"{where}: tensor index {i!r} out of range (0..{len(tensors) - 1})")
        return tensors[i]

    def gets(ix: Any, where: str) -> list[TensorTrace | None] | None:
        return None if ix is None else [get(i, f"{where}[{k}]") for k, i in enumerate(_list(ix, where))]

    def node_id(i: Any, where: str, optional: bool = True) -> int | None:
        if i is None and optional:
            return None
        if type(i) is not int or not 0 <= i < n_nodes:
            raise TraceFormatError(f"{where}: {i!r} is not a node id in 0..{n_nodes - 1}")
        return i

    st = StepTrace(run=_str(d["run"], "run"), step=_int(d["step"], "step"))
    st.error = _opt_str(d.get("error"), "error")
    st.meta = _plain(_map(d.get("meta") or {}, "meta"), "meta")
    for k, n in enumerate(d["nodes"]):
        w = f"nodes[{k}]"
        n = _map(n, w)
        if n.get("id") != k or type(n.get("id")) is not int:
            raise TraceFormatError(f"{w}.id: expected {k}, got {n.get('id')!r} (ids are positions)")
        runs = []
        for j, r in enumerate(_list(n.get("runs") or [], f"{w}.runs")):
            wr = f"{w}.runs[{j}]"
            if not isinstance(r, list) or len(r) != 5:
                raise TraceFormatError(f"{wr}: expected [pass, order, go, gi, time_us]")
            runs.append(NodeRun(_int(r[0], f"{wr}.pass"), _int(r[1], f"{wr}.order"),
                                gets(_list(r[2], f"{wr}.go"), f"{wr}.go") or [], gets(r[3], f"{wr}.gi"),
                                _opt_num(r[4], f"{wr}.time_us")))
        st.nodes.append(NodeTrace(
            id=k, name=_str(n.get("name"), f"{w}.name"), kind=_str(n.get("kind", "op"), f"{w}.kind"),
            module=_opt_str(n.get("module"), f"{w}.module"), param=_opt_str(n.get("param"), f"{w}.param"),
            source=_opt_str(n.get("source"), f"{w}.source"), schema=_opt_str(n.get("schema"), f"{w}.schema"),
            order=_opt_int(n.get("order"), f"{w}.order"),
            input_labels=_strs(n.get("labels"), f"{w}.labels"), input_args=_strs(n.get("args"), f"{w}.args"),
            input_shapes=_shapes(n.get("in_shapes"), f"{w}.in_shapes"),
            output_shapes=_shapes(n.get("out_shapes"), f"{w}.out_shapes"),
            output_dtypes=_strs(n.get("out_dtypes"), f"{w}.out_dtypes", optional=True),
            grad_inputs=gets(n.get("gi"), f"{w}.gi"), grad_outputs=gets(n.get("go"), f"{w}.go"),
            time_us=_opt_num(n.get("t"), f"{w}.t"), runs=runs,
        ))
    for k, e in enumerate(_list(d["edges"], "edges")):
        if not (isinstance(e, list) and len(e) == 3 and all(type(x) is int for x in e)) or \
                not (0 <= e[0] < n_nodes and 0 <= e[1] < n_nodes):
            raise TraceFormatError(f"edges[{k}]: {e!r} is not [src, dst, slot] with node ids in 0..{n_nodes - 1}")
        st.edges.append((e[0], e[1], e[2]))
    for name, m in _map(d.get("modules") or {}, "modules").items():
        w = f"modules[{name!r}]"
        _str(name, f"modules: key {name!r}")
        m = _map(m, w)
        calls = []
        for j, c in enumerate(_list(m.get("calls") or [], f"{w}.calls")):
            wc = f"{w}.calls[{j}]"
            c = _map(c, wc)
            calls.append(ModuleCall(gets(c.get("gi"), f"{wc}.gi") or [], gets(c.get("go"), f"{wc}.go") or [],
                                    [node_id(x, f"{wc}.in") for x in _list(c.get("in") or [], f"{wc}.in")],
                                    [node_id(x, f"{wc}.out") for x in _list(c.get("out") or [], f"{wc}.out")],
                                    node_id(c.get("last"), f"{wc}.last")))
        st.modules[name] = ModuleTrace(name=name, type=_str(m.get("type", ""), f"{w}.type"),
                                       params=_strs(m.get("params"), f"{w}.params"), calls=calls)
    for name, i in _map(d.get("params") or {}, "params").items():
        t = get(i, f"params[{_str(name, f'params: key {name!r}')!r}]")
        if t is not None:
            st.params[name] = t
    for k, p in enumerate(_list(d.get("passes") or [], "passes")):
        w = f"passes[{k}]"
        p = _map(p, w)
        st.passes.append(BackwardPass(
            index=_int(p.get("index"), f"{w}.index"), api=_str(p.get("api"), f"{w}.api"),
            roots=[x for x in (node_id(r, f"{w}.roots", False) for r in _list(p.get("roots"), f"{w}.roots"))
                   if x is not None],
            root_grads=gets(p.get("root_grads"), f"{w}.root_grads") or [],
            retain_graph=_bool(p.get("retain_graph", False), f"{w}.retain_graph"),
            create_graph=_bool(p.get("create_graph", False), f"{w}.create_graph"),
            start=_int(p.get("start", 0), f"{w}.start"), end=_int(p.get("end", 0), f"{w}.end")))
    for k, e in enumerate(_list(d.get("execution") or [], "execution")):
        if not (isinstance(e, list) and len(e) == 2 and type(e[1]) is int and e[1] >= 0):
            raise TraceFormatError(f"execution[{k}]: {e!r} is not [node id, run index]")
        st.execution.append((node_id(e[0], f"execution[{k}]", False) or 0, e[1]))
    for k, p in enumerate(_list(d.get("problems") or [], "problems")):
        w = f"problems[{k}]"
        p = _map(p, w)
        st.problems.append(Problem(kind=_str(p.get("kind"), f"{w}.kind"),
                                   message=_str(p.get("message"), f"{w}.message"),
                                   node=node_id(p.get("node"), f"{w}.node"),
                                   param=_opt_str(p.get("param"), f"{w}.param"),
                                   source=_opt_str(p.get("source"), f"{w}.source")))
    for key in ("rank", "world_size"):
        v = d.get(key)
        if v is not None:
            setattr(st, key, _int(v, key))
    st.trigger = _opt_str(d.get("trigger"), "trigger")
    st.optimizer_steps = [optimizer_step_from_wire(o, f"optimizer_steps[{k}]")
                          for k, o in enumerate(_list(d.get("optimizer_steps") or [], "optimizer_steps"))]
    return st


def optimizer_step_to_wire(o: OptimizerStep) -> WireOptimizerStep:
    return {"optimizer": o.optimizer, "params": list(o.params), "lr": [float(x) for x in o.lr],
            "scale": o.scale, "skipped": o.skipped, "grad_norm": o.grad_norm,
            "grad_norm_before_clip": o.grad_norm_before_clip}


def optimizer_step_from_wire(d: Any, where: str) -> OptimizerStep:
    d = _map(d, where)
    lr = _list(d.get("lr") or [], f"{where}.lr")
    return OptimizerStep(optimizer=_str(d.get("optimizer"), f"{where}.optimizer"),
                         params=_strs(d.get("params"), f"{where}.params"),
                         lr=[_num(x, f"{where}.lr[{k}]") for k, x in enumerate(lr)],
                         scale=_opt_num(d.get("scale"), f"{where}.scale"),
                         skipped=_bool(d.get("skipped", False), f"{where}.skipped"),
                         grad_norm=_opt_num(d.get("grad_norm"), f"{where}.grad_norm"),
                         grad_norm_before_clip=_opt_num(d.get("grad_norm_before_clip"),
                                                        f"{where}.grad_norm_before_clip"))


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _plain(v: Any, where: str, depth: int = 0) -> Any:
    """`meta`: what JSON can say (maps with string keys, lists, strings, numbers, booleans, nil)."""
    if depth > 32:
        raise TraceFormatError(f"{where}: nested more than 32 levels")
    if v is None or type(v) in (str, int, float, bool):
        return v
    if isinstance(v, (str, int, float)):  # subclasses (torch's version string) as their plain type
        return bool(v) if isinstance(v, bool) else str(v) if isinstance(v, str) else int(v) if isinstance(
            v, int) else float(v)
    if isinstance(v, list):
        return [_plain(x, f"{where}[{k}]", depth + 1) for k, x in enumerate(v)]
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise TraceFormatError(f"{where}: key {k!r:.40} is not a string")
        return {k: _plain(x, f"{where}.{k}", depth + 1) for k, x in v.items()}
    raise TraceFormatError(f"{where}: {type(v).__name__} is not allowed (strings, numbers, lists and maps only)")


def _opt_str(v: Any, where: str) -> str | None:
    return None if v is None else _str(v, where)


def _list(v: Any, where: str) -> list[Any]:
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


def _strs(v: Any, where: str, optional: bool = False) -> list[Any]:
    out = _list(v or [], where)
    for k, x in enumerate(out):
        if not (isinstance(x, str) or (optional and x is None)):
            raise TraceFormatError(f"{where}[{k}]: expected a string, got {type(x).__name__}")
    return list(out)


def _shapes(v: Any, where: str) -> list[tuple[int, ...] | None]:
    out: list[tuple[int, ...] | None] = []
    for k, s in enumerate(_list(v or [], where)):
        if s is None:
            out.append(None)
            continue
        if not isinstance(s, list) or not all(type(x) is int and x >= 0 for x in s):
            raise TraceFormatError(f"{where}[{k}]: expected a list of non-negative ints or nil, got {s!r:.80}")
        out.append(tuple(s))
    return out


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack's errors, and TypeError for a map key Python cannot hash
        raise TraceFormatError(f"not a msgpack document: {exc}") from exc
