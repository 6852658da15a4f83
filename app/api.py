"""The read-only JSON API over the trace store (docs/api.md has examples).

    GET /api/runs                                   runs, with step counts and their ranks
    GET /api/runs/<run>/steps                       steps of a run
    GET /api/runs/<run>/steps/<step>                the graph: nodes, edges, execution order, stats
    GET /api/runs/<run>/steps/<step>/nodes/<id>     one node with its tensors, thumbnails included

The three routes under a run take `?rank=R` (torch.distributed rank, default 0; a run outside
torch.distributed has rank 0 only): not an integer ≥ 0 → 400, a rank the run does not have → 404.

JSON has no NaN or Infinity: non-finite numbers are written as null (the `nan`/`inf` counts of each
tensor say how many there were). Arrays are nested lists.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flask import Flask, Response, jsonify, request

from tracer._codec import TraceFormatError, decode_array
from tracer._model import STAT_NAMES
from tracer.store import StoreError, TraceStore


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _array(a: dict[str, Any] | None, where: str) -> list[Any] | None:
    if a is None:
        return None
    arr = decode_array(a, where).astype(np.float64)
    out = np.where(np.isfinite(arr), arr, np.nan).tolist()
    return _clean(out)


def _clean(v: Any) -> Any:
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return _finite(v)


def tensor_json(t: dict[str, Any], arrays: dict[str, Any] | None = None, index: int = 0) -> dict[str, Any]:
    out = {"index": index, "shape": t["shape"], "dtype": t["dtype"], "view": t.get("view", ""),
           "device": t.get("device", "cpu"), "stats": {k: _finite(v) for k, v in zip(STAT_NAMES, t["stats"])}}
    if arrays is not None:
        out["thumb"] = _array(arrays.get("thumb"), f"tensor {index} thumb")
        out["values"] = _array(arrays.get("values"), f"tensor {index} values")
    return out


def graph_json(wire: dict[str, Any]) -> dict[str, Any]:
    """The step as JSON: nodes refer to tensors by index into `tensors` (summaries, no arrays)."""
    nodes = wire["nodes"]
    order = [n["id"] for n in sorted((n for n in nodes if n.get("order") is not None), key=lambda n: n["order"])]
    return {"run": wire["run"], "step": wire["step"], "rank": wire.get("rank"), "world_size": wire.get("world_size"),
            "error": wire.get("error"), "meta": wire.get("meta", {}),
            "nodes": [{k: _clean(v) if k != "runs" else v for k, v in n.items()} for n in nodes],
            "edges": wire["edges"], "order": order, "execution": wire.get("execution", []),
            "modules": wire.get("modules", {}), "params": wire.get("params", {}),
            "passes": wire.get("passes", []),
            "tensors": [tensor_json(t, None, i) for i, t in enumerate(wire["tensors"])]}


def node_json(wire: dict[str, Any], node_id: int, arrays: dict[int, dict[str, Any]]) -> dict[str, Any]:
    n = wire["nodes"][node_id]

    def tens(ix: list[int | None] | None) -> list[Any] | None:
        if ix is None:
            return None
        return [None if i is None else tensor_json(wire["tensors"][i], arrays.get(i, {}), i) for i in ix]

    return {**{k: _clean(v) for k, v in n.items() if k not in ("gi", "go", "runs")},
            "grad_inputs": tens(n.get("gi")), "grad_outputs": tens(n.get("go")),
            "runs": [{"pass": r[0], "order": r[1], "grad_outputs": r[2], "grad_inputs": r[3], "time_us": r[4]}
                     for r in n.get("runs", [])]}


def node_tensor_indices(n: dict[str, Any]) -> set[int]:
    return {i for i in (n.get("gi") or []) + (n.get("go") or []) if i is not None}


def _error(message: str, status: int) -> Response:
    resp = jsonify({"error": message})
    resp.status_code = status
    return resp


def register_api(server: Flask, store: TraceStore, state: Any = None) -> None:
    @server.get("/api/runs")
    def api_runs() -> Response:
        return jsonify({"runs": store.runs()})

    def rank_arg(run: str) -> int | Response:
        """`?rank=` (default 0), or the error answer: 400 when malformed, 404 when the run lacks it."""
        text = request.args.get("rank")
        if text is None:
            return 0
        try:
            rank = _int(text)
        except ValueError as exc:
            return _error(f"rank: {exc}", 400)
        if rank < 0:
            return _error(f"rank: {rank} is negative (ranks are 0 .. world_size - 1)", 400)
        ranks = store.ranks(run)
        if rank not in ranks and (ranks or rank != 0):
            return _error(f"run {run!r} has no rank {rank} (its ranks: {ranks})", 404)
        return rank

    @server.get("/api/runs/<run>/steps")
    def api_steps(run: str) -> Response:
        rank = rank_arg(run)
        if isinstance(rank, Response):
            return rank
        steps = store.steps(run, rank)
        if not steps and run not in {r["run"] for r in store.runs()}:
            return _error(f"no run {run!r}", 404)
        return jsonify({"run": run, "rank": rank, "steps": steps})

    @server.get("/api/runs/<run>/steps/<step>")
    def api_step(run: str, step: str) -> Response:
        rank = rank_arg(run)
        if isinstance(rank, Response):
            return rank
        try:
            wire = store.read_graph(run, _int(step), rank)
        except ValueError as exc:
            return _error(str(exc), 400)
        except StoreError as exc:
            return _error(str(exc), 404)
        return jsonify(graph_json(wire))

    @server.get("/api/runs/<run>/steps/<step>/nodes/<node>")
    def api_node(run: str, step: str, node: str) -> Response:
        rank = rank_arg(run)
        if isinstance(rank, Response):
            return rank
        try:
            s, nid = _int(step), _int(node)
            wire = store.read_graph(run, s, rank)
        except ValueError as exc:
            return _error(str(exc), 400)
        except StoreError as exc:
            return _error(str(exc), 404)
        if not 0 <= nid < len(wire["nodes"]):
            return _error(f"no node {nid} in step {s} of run {run!r} (it has {len(wire['nodes'])})", 404)
        arrays = store.read_arrays(run, s, node_tensor_indices(wire["nodes"][nid]), rank)
        try:
            return jsonify(node_json(wire, nid, arrays))
        except TraceFormatError as exc:
            return _error(f"stored tensors of node {nid} are malformed: {exc}", 500)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
