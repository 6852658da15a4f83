"""The JSON forms of a step, a node and a tensor (`tracer.wire`'s wire form as JSON) that the API answers.

JSON has no NaN or Infinity: non-finite numbers are written as null (the `nan`/`inf` counts of each
tensor say how many there were), and a thumbnail's values as the strings "NaN", "Infinity" and
"-Infinity" (`thumb_json`). Arrays are nested lists.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gradscape.tracer.wire import (
    STAT_NAMES,
    TensorArrays,
    TensorRefs,
    WireArray,
    WireNode,
    WireStep,
    WireTensor,
    decode_array,
    node_runs,
)


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _array(a: WireArray | None, where: str) -> list[Any] | None:
    if a is None:
        return None
    arr = decode_array(a, where).astype(np.float64)
    out = np.where(np.isfinite(arr), arr, np.nan).tolist()
    return _clean(out)


def _clean(v: Any) -> Any:
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return _finite(v)


def tensor_json(t: WireTensor, arrays: TensorArrays | None = None, index: int = 0) -> dict[str, Any]:
    out = {"index": index, "shape": t["shape"], "dtype": t["dtype"], "view": t["view"],
           "device": t["device"], "stats": {k: _finite(v) for k, v in zip(STAT_NAMES, t["stats"])}}
    if arrays is not None:
        out["thumb"] = _array(arrays["thumb"], f"tensor {index} thumb")
        out["values"] = _array(arrays["values"], f"tensor {index} values")
    return out


def graph_json(wire: WireStep) -> dict[str, Any]:
    """The step as JSON: nodes refer to tensors by index into `tensors` (summaries, no arrays)."""
    nodes = wire["nodes"]
    ran = sorted((order, n["id"]) for n in nodes if (order := n["order"]) is not None)
    return {"run": wire["run"], "step": wire["step"], "rank": wire["rank"], "world_size": wire["world_size"],
            "error": wire["error"], "meta": wire["meta"],
            "nodes": [{k: _clean(v) if k != "runs" else v for k, v in n.items()} for n in nodes],
            "edges": wire["edges"], "order": [nid for _, nid in ran], "execution": wire["execution"],
            "modules": wire["modules"], "params": wire["params"], "passes": wire["passes"],
            "problems": wire["problems"], "not_in_step": wire["not_in_step"],
            "tensors": [tensor_json(t, None, i) for i, t in enumerate(wire["tensors"])],
            "trigger": wire["trigger"],  # the monitor: why an unscheduled step was traced, and its optimizer steps
            "optimizer_steps": [{k: _clean(v) for k, v in o.items()} for o in wire["optimizer_steps"]]}


def node_json(wire: WireStep, node_id: int, arrays: dict[int, TensorArrays]) -> dict[str, Any]:
    n = wire["nodes"][node_id]
    none: TensorArrays = {"thumb": None, "values": None}

    def tens(ix: TensorRefs | None) -> list[Any] | None:
        if ix is None:
            return None
        return [None if i is None else tensor_json(wire["tensors"][i], arrays.get(i, none), i) for i in ix]

    return {**{k: _clean(v) for k, v in n.items() if k not in ("gi", "go", "runs")},
            "grad_inputs": tens(n["gi"]), "grad_outputs": tens(n["go"]),
            "runs": [{"pass": r.pass_index, "order": r.order, "grad_outputs": r.go, "grad_inputs": r.gi,
                      "time_us": r.time_us} for r in node_runs(n)]}


def node_tensor_indices(n: WireNode) -> set[int]:
    return {i for i in (n["gi"] or []) + (n["go"] or []) if i is not None}


def thumb_json(a: Any) -> dict[str, Any]:
    """A thumbnail (`encode_array` map) as JSON: `{"shape": [rows, cols], "values": [[...]]}`, row by
    row, with NaN, +Inf and −Inf as the strings "NaN", "Infinity" and "-Infinity" (JSON has no
    such numbers)."""
    v = decode_array(a, "thumb").astype(np.float64)
    rows = v.tolist()
    if not np.isfinite(v).all():
        rows = [[x if math.isfinite(x) else "NaN" if math.isnan(x) else "Infinity" if x > 0 else "-Infinity"
                 for x in row] for row in rows]
    return {"shape": list(v.shape), "values": rows}
