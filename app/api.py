"""The read-only JSON API over the trace store (docs/api.md has examples).

    GET /api/runs                                   runs, with step counts and their ranks
    GET /api/runs/<run>/steps                       steps of a run (of one rank), and its ranks
    GET /api/runs/<run>/steps/<step>                the graph: nodes, edges, execution order, stats
    GET /api/runs/<run>/steps/<step>/nodes/<id>     one node with its tensors, thumbnails included

The three routes under a run take `?rank=R` (torch.distributed rank, default 0; a run outside
torch.distributed has rank 0 only): not an integer ≥ 0 → 400, a rank the run does not have → 404.

JSON has no NaN or Infinity: non-finite numbers are written as null (the `nan`/`inf` counts of each
tensor say how many there were). Arrays are nested lists.

Every answer under `/api/` is JSON, errors included (`{"error": "..."}`): parameters are checked here
(400 names the bad one), a missing run, step or node is 404, an unknown path 404, a wrong method 405.
Error texts say what was not found, never where the server keeps its files. A 5xx is a bug; it is
still answered as JSON, without a traceback.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException, InternalServerError

from gradscape.tracer.protocol import MAX_NAME, ProtocolError, check_name
from gradscape.tracer.store import StoreError, TraceStore
from gradscape.tracer.wire import (
    STAT_NAMES,
    TensorArrays,
    TensorRefs,
    TraceFormatError,
    WireArray,
    WireNode,
    WireStep,
    WireTensor,
    decode_array,
    node_runs,
)

server_log = logging.getLogger(__name__)
MAX_INDEX = (1 << 63) - 1  # SQLite's INTEGER range: a step or node number beyond it cannot exist


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
            "problems": wire["problems"], "tensors": [tensor_json(t, None, i) for i, t in enumerate(wire["tensors"])],
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


def _error(message: str, status: int) -> Response:
    resp = jsonify({"error": message})
    resp.status_code = status
    return resp


class BadParameter(ValueError):
    """A route parameter is malformed (answered 400); the text names the parameter."""


class NotFound(LookupError):
    """What a route asked for does not exist (answered 404); the text says what, never where."""


def check_run(run: str) -> str:
    try:
        return check_name(run, "run")
    except ProtocolError as exc:
        raise BadParameter(str(exc)) from None


def check_index(text: str, what: str) -> int:
    """A step or node number from the path: decimal digits only, 0..2^63-1 (SQLite's range)."""
    if not (0 < len(text) <= 19 and text.isascii() and text.isdigit()):
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise BadParameter(f"{what} must be an integer in 0..{MAX_INDEX}, got {shown!r}")
    value = int(text)
    if value > MAX_INDEX:
        raise BadParameter(f"{what} must be an integer in 0..{MAX_INDEX}, got {text!r}")
    return value


def _read_graph(store: TraceStore, run: str, step: int, rank: int = 0) -> WireStep:
    try:
        return store.read_graph(run, step, rank)
    except StoreError:
        raise NotFound(f"no step {step} in run {run!r}" + (f" (rank {rank})" if rank else "")) from None


def register_api(server: Flask, store: TraceStore, state: Any = None) -> None:
    """Add the routes, and the error handling every `/api/` path shares (routes added later by other
    modules get it too: it is keyed on the path, not on the route)."""

    @server.get("/api/runs")
    def api_runs() -> Response:
        return jsonify({"runs": store.runs()})

    def rank_arg(run: str) -> int:
        """`?rank=` (default 0): BadParameter when malformed, NotFound when the run lacks that rank."""
        text = request.args.get("rank")
        if text is None:
            return 0
        rank = check_index(text, "rank")
        ranks = store.ranks(run)
        if rank not in ranks and (ranks or rank != 0):
            raise NotFound(f"run {run!r} has no rank {rank} (its ranks: {ranks})")
        return rank

    @server.get("/api/runs/<run>/steps")
    def api_steps(run: str) -> Response:
        check_run(run)
        rank = rank_arg(run)
        steps = store.steps(run, rank)
        if not steps and run not in {r["run"] for r in store.runs()}:
            raise NotFound(f"no run {run!r}")
        return jsonify({"run": run, "rank": rank, "ranks": store.ranks(run), "steps": steps})

    @server.get("/api/runs/<run>/steps/<step>")
    def api_step(run: str, step: str) -> Response:
        check_run(run)
        rank = rank_arg(run)
        return jsonify(graph_json(_read_graph(store, run, check_index(step, "step"), rank)))

    @server.get("/api/runs/<run>/steps/<step>/nodes/<node>")
    def api_node(run: str, step: str, node: str) -> Response:
        check_run(run)
        rank = rank_arg(run)
        s, nid = check_index(step, "step"), check_index(node, "node")
        wire = _read_graph(store, run, s, rank)
        if not 0 <= nid < len(wire["nodes"]):
            raise NotFound(f"no node {nid} in step {s} of run {run!r} (it has {len(wire['nodes'])})")
        arrays = store.read_arrays(run, s, node_tensor_indices(wire["nodes"][nid]), rank)
        try:
            return jsonify(node_json(wire, nid, arrays))
        except TraceFormatError as exc:
            return _error(f"stored tensors of node {nid} of step {s} in run {run!r} are malformed: {exc}", 500)

    @server.route("/api/", methods=_ALL_METHODS)
    @server.route("/api/<path:rest>", methods=_ALL_METHODS)
    def api_unknown(rest: str = "") -> Response:
        # Without this, Dash's catch-all page route answers any unknown /api/ path with the page.
        return _error(f"no API route {_shown_path()} (see docs/api.md)", 404)

    server.register_error_handler(BadParameter, lambda exc: _error(str(exc), 400))
    server.register_error_handler(NotFound, lambda exc: _error(str(exc), 404))
    server.register_error_handler(HTTPException, _http_error)  # 500 included: Flask's wrapper of any other error


_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def _shown_path() -> str:
    path = request.path
    return repr(path if len(path) <= MAX_NAME else path[:MAX_NAME] + "…")


def _http_error(exc: HTTPException) -> Any:
    if not request.path.startswith("/api/"):
        return exc
    if isinstance(exc, InternalServerError):
        cause = exc.original_exception
        server_log.error("gradscape: %s %s failed", request.method, request.path, exc_info=cause)
        return _error(f"internal error answering {_shown_path()} ({type(cause).__name__}); the server log has "
                      "details", 500)
    if exc.code == 405:
        return _error(f"{request.method} is not allowed on {_shown_path()}", 405)
    return _error(f"{exc.name} ({_shown_path()})", exc.code or 400)
