"""A step's fields but its nodes, edges, tensors and execution order, checked where they are, and given back in
the form the schema writes them (`codec.step_fields`' form): `checked_fields`.

NOTE [Fields checked in place]
    The server stores a step sent as columns without building a `StepTrace` (tracer/wire/column_check.py):
    its fields are checked here and the result is what is stored. The readers that do build one
    (`validation.fields_from_wire`, for a step read back or sent as maps) build it from the result, so each
    field is checked in one place. What the schema leaves out is filled as the writer fills it: a missing
    list is empty, a pass's `retain_graph` and `create_graph` false, a number a float; `params` leaves out a parameter
    without a gradient, as a `StepTrace` has none; keys the schema does not name are dropped. Tensor
    indices and node ids are checked against the step's counts and kept as sent.
"""

from __future__ import annotations

from typing import Any

from gradscape.tracer.wire.checks import (
    a_bool,
    a_map,
    a_num,
    a_str,
    an_int,
    checked_list,
    opt_num,
    opt_str,
    plain,
    str_list,
    versioned,
)
from gradscape.tracer.wire.types import TraceFormatError
from gradscape.tracer.wire.versions import WIRE_VERSION


class Counts:
    """What a step's fields may refer to: tensor indices in 0..`n_tensors` - 1, node ids in 0..`n_nodes` - 1."""

    def __init__(self, n_tensors: int, n_nodes: int) -> None:
        self.n_tensors, self.n_nodes = n_tensors, n_nodes

    def tensor(self, i: Any, where: str) -> int | None:
        if i is None:
            return None
        if type(i) is not int or not 0 <= i < self.n_tensors:
            raise TraceFormatError(f"{where}: tensor index {i!r} out of range (0..{self.n_tensors - 1})")
        return i

    def tensor_refs(self, ix: Any, where: str) -> list[int | None]:
        """A list of tensor indices (nil as an empty list)."""
        return [] if ix is None else [self.tensor(i, f"{where}[{k}]") for k, i in enumerate(checked_list(ix, where))]

    def node(self, i: Any, where: str, optional: bool = True) -> int | None:
        if i is None and optional:
            return None
        if type(i) is not int or not 0 <= i < self.n_nodes:
            raise TraceFormatError(f"{where}: {i!r} is not a node id in 0..{self.n_nodes - 1}")
        return i


def checked_fields(d: Any, counts: Counts) -> dict[str, Any]:
    """The step's fields (NOTE [Fields checked in place]); raises `TraceFormatError` naming the first that is
    wrong."""
    d = versioned(d)
    for key in ("run", "step"):
        if key not in d:
            raise TraceFormatError(f"step: missing field {key!r}")
    params = {}
    for name, i in a_map(d.get("params") or {}, "params").items():
        ref = counts.tensor(i, f"params[{a_str(name, f'params: key {name!r}')!r}]")
        if ref is not None:
            params[name] = ref
    return {
        "v": WIRE_VERSION, "run": a_str(d["run"], "run"), "step": an_int(d["step"], "step"),
        "error": opt_str(d.get("error"), "error"), "meta": plain(a_map(d.get("meta") or {}, "meta"), "meta"),
        "modules": {name: _module(name, m, counts) for name, m in a_map(d.get("modules") or {}, "modules").items()},
        "params": params,
        "passes": [_pass(p, k, counts) for k, p in enumerate(checked_list(d.get("passes") or [], "passes"))],
        "problems": [_problem(p, k, counts)
                     for k, p in enumerate(checked_list(d.get("problems") or [], "problems"))],
        "not_in_step": [a_str(p, f"not_in_step[{k}]")
                        for k, p in enumerate(checked_list(d.get("not_in_step") or [], "not_in_step"))],
        "rank": None if d.get("rank") is None else an_int(d["rank"], "rank"),
        "world_size": None if d.get("world_size") is None else an_int(d["world_size"], "world_size"),
        "trigger": opt_str(d.get("trigger"), "trigger"),
        "optimizer_steps": [_optimizer_step(o, f"optimizer_steps[{k}]")
                            for k, o in enumerate(checked_list(d.get("optimizer_steps") or [], "optimizer_steps"))],
    }


def _module(name: Any, m: Any, counts: Counts) -> dict[str, Any]:
    w = f"modules[{name!r}]"
    a_str(name, f"modules: key {name!r}")
    m = a_map(m, w)
    calls = []
    for j, c in enumerate(checked_list(m.get("calls") or [], f"{w}.calls")):
        wc = f"{w}.calls[{j}]"
        c = a_map(c, wc)
        calls.append({"gi": counts.tensor_refs(c.get("gi"), f"{wc}.gi"),
                      "go": counts.tensor_refs(c.get("go"), f"{wc}.go"),
                      "in": [counts.node(x, f"{wc}.in") for x in checked_list(c.get("in") or [], f"{wc}.in")],
                      "out": [counts.node(x, f"{wc}.out") for x in checked_list(c.get("out") or [], f"{wc}.out")],
                      "last": counts.node(c.get("last"), f"{wc}.last")})
    return {"type": a_str(m.get("type", ""), f"{w}.type"), "params": str_list(m.get("params"), f"{w}.params"),
            "calls": calls}


def _pass(p: Any, k: int, counts: Counts) -> dict[str, Any]:
    w = f"passes[{k}]"
    p = a_map(p, w)
    return {"index": an_int(p.get("index"), f"{w}.index"), "api": a_str(p.get("api"), f"{w}.api"),
            "roots": [counts.node(r, f"{w}.roots", False) for r in checked_list(p.get("roots"), f"{w}.roots")],
            "root_grads": counts.tensor_refs(p.get("root_grads"), f"{w}.root_grads"),
            "retain_graph": a_bool(p.get("retain_graph", False), f"{w}.retain_graph"),
            "create_graph": a_bool(p.get("create_graph", False), f"{w}.create_graph"),
            "start": an_int(p.get("start", 0), f"{w}.start"), "end": an_int(p.get("end", 0), f"{w}.end")}


def _problem(p: Any, k: int, counts: Counts) -> dict[str, Any]:
    w = f"problems[{k}]"
    p = a_map(p, w)
    return {"kind": a_str(p.get("kind"), f"{w}.kind"), "message": a_str(p.get("message"), f"{w}.message"),
            "node": counts.node(p.get("node"), f"{w}.node"), "param": opt_str(p.get("param"), f"{w}.param"),
            "source": opt_str(p.get("source"), f"{w}.source")}


def _optimizer_step(d: Any, where: str) -> dict[str, Any]:
    d = a_map(d, where)
    lr = checked_list(d.get("lr") or [], f"{where}.lr")
    return {"optimizer": a_str(d.get("optimizer"), f"{where}.optimizer"),
            "params": str_list(d.get("params"), f"{where}.params"),
            "lr": [a_num(x, f"{where}.lr[{k}]") for k, x in enumerate(lr)],
            "scale": opt_num(d.get("scale"), f"{where}.scale"),
            "skipped": a_bool(d.get("skipped", False), f"{where}.skipped"),
            "grad_norm": opt_num(d.get("grad_norm"), f"{where}.grad_norm"),
            "grad_norm_before_clip": opt_num(d.get("grad_norm_before_clip"), f"{where}.grad_norm_before_clip")}
