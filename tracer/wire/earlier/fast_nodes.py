"""An earlier release's node maps read quickly (NOTE [Fast read] in tracer/wire/fast_read.py): a node whose
every field is exactly as those releases wrote it is built here, and anything else gets None, for the checked
reader (`maps_step`) to build or to name what is wrong."""

from __future__ import annotations

from typing import Any

from gradscape.tracer._model import NodeRun, NodeTrace, TensorTrace

_LO, _HI = -(1 << 63), (1 << 63) - 1  # what SQLite can hold (`checks.an_int`)
_BAD: Any = object()  # a field that is not in the common form


def node(n: Any, k: int, tensors: list[TensorTrace]) -> NodeTrace | None:
    """Node `k`, or None."""
    if type(n) is not dict or type(n.get("id")) is not int or n["id"] != k:
        return None
    g = n.get
    name, kind, order, t = g("name"), g("kind", "op"), g("order"), g("t")
    if type(name) is not str or type(kind) is not str or not _opt_ints((order,)) or not _opt_num(t):
        return None
    texts = (g("module"), g("param"), g("source"), g("schema"))
    if any(s is not None and type(s) is not str for s in texts):
        return None
    labels, args, dtypes = _strs(g("labels")), _strs(g("args")), _strs(g("out_dtypes"), True)
    ins, outs = _shapes(g("in_shapes")), _shapes(g("out_shapes"))
    gi, go = _refs(g("gi"), tensors), _refs(g("go"), tensors)
    runs = _runs(g("runs"), tensors)
    if _BAD in (labels, args, dtypes, ins, outs, gi, go, runs):
        return None
    return NodeTrace(id=k, name=name, kind=kind, module=texts[0], param=texts[1], source=texts[2], schema=texts[3],
                     order=order, input_labels=labels, input_args=args, input_shapes=ins, output_shapes=outs,
                     output_dtypes=dtypes, grad_inputs=gi, grad_outputs=go,
                     time_us=None if t is None else float(t), runs=runs)


def _opt_ints(vs: tuple[Any, ...]) -> bool:
    return all(v is None or (type(v) is int and _LO <= v <= _HI) for v in vs)


def _opt_num(v: Any) -> bool:
    return v is None or type(v) is float or type(v) is int


def _strs(v: Any, optional: bool = False) -> Any:
    if v is None:
        return []
    if type(v) is not list:
        return _BAD
    for x in v:
        if type(x) is not str and not (optional and x is None):
            return _BAD
    return list(v)


def _shapes(v: Any) -> Any:
    if v is None:
        return []
    if type(v) is not list:
        return _BAD
    out: list[tuple[int, ...] | None] = []
    for s in v:
        if s is None:
            out.append(None)
            continue
        if type(s) is not list:
            return _BAD
        for x in s:
            if type(x) is not int or x < 0:
                return _BAD
        out.append(tuple(s))
    return out


def _refs(ix: Any, tensors: list[TensorTrace]) -> Any:
    """Tensor indices to the step's tensors (None stays None); `_BAD` for anything else."""
    if ix is None:
        return None
    if type(ix) is not list:
        return _BAD
    n = len(tensors)
    out: list[TensorTrace | None] = []
    for i in ix:
        if i is None:
            out.append(None)
        elif type(i) is int and 0 <= i < n:
            out.append(tensors[i])
        else:
            return _BAD
    return out


def _runs(v: Any, tensors: list[TensorTrace]) -> Any:
    if v is None:
        return []
    if type(v) is not list:
        return _BAD
    out = []
    for r in v:
        if type(r) is not list or len(r) != 5 or type(r[0]) is not int or type(r[1]) is not int \
                or not _opt_ints((r[0], r[1])) or type(r[2]) is not list or not _opt_num(r[4]):
            return _BAD
        go, gi = _refs(r[2], tensors), _refs(r[3], tensors)
        if go is _BAD or gi is _BAD:
            return _BAD
        out.append(NodeRun(r[0], r[1], go, gi, None if r[4] is None else float(r[4])))
    return out
