"""Live breakpoints: the server side (routes, per-run state, the tracers' `/debug` namespace).

    POST   /api/runs/<run>/breakpoints     add one: {"on": "node", "name": "AddmmBackward0"}, ...
    GET    /api/runs/<run>/breakpoints     the run's breakpoints
    DELETE /api/runs/<run>/breakpoints     clear them
    GET    /api/runs/<run>/paused          {"paused": true, "step", "node", "executed"} or {"paused": false}
    GET    /api/runs/<run>/paused/nodes    the partial backward: every node run so far, with statistics
    GET    /api/runs/<run>/paused/nodes/<id>  one of them with its thumbnails' values (?order=k: that run)
    POST   /api/runs/<run>/resume          {"mode": "step"} or {"mode": "continue"}

The server holds each run's breakpoints in memory and pushes the whole list to the run's tracers,
which connect to `/debug` (see NOTE [Breakpoints] in tracer.debug.breakpoints). A paused tracer sends the
partial backward in its `paused` message (with the thumbnails of its newest nodes: NOTE [Paused
heatmaps]); it is checked (`check_paused_nodes`), kept here, in memory, until the run resumes or its
tracer goes away, and served by `/paused/nodes` and `/paused/nodes/<id>`. The page hears `paused` /
`breakpoints` on `/ui` (they only say which run changed; on connecting, one `paused` catch-up lists
the runs that are paused or have breakpoints) and reads the state from these routes.

Writes need the token when the server has one (the app's token gate) and are refused with 403 when
the request's `Origin` is not the server's own: another site's page must not pause anyone's
training. Bad input is answered with JSON 4xx naming what was wrong, never HTML.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from flask import Flask, Response, jsonify, request
from flask_socketio import Namespace, SocketIO, join_room

from gradscape.app.api import BadParameter, check_index
from gradscape.tracer import protocol
from gradscape.tracer.protocol import DEBUG_NAMESPACE as NAMESPACE
from gradscape.tracer.protocol import check_breakpoint
from gradscape.tracer.wire import TraceFormatError, decode_array

log = logging.getLogger(__name__)

MAX_BREAKPOINTS = 64
MAX_PAUSED_NODES = 200_000
MAX_PAUSED_THUMB_BYTES = protocol.MAX_MESSAGE  # thumbnails one paused message may carry, all together
MAX_THUMB_ELEMENTS = 1 << 20  # one thumbnail (the tracer's are at most `thumb`×`thumb`, 64×64 by default)
MAX_RANK = 64  # dimensions of a gradient's shape
DEBUG_EVENTS = ("hello", "paused")
SLOTS = ("grad_outputs", "grad_inputs")


@dataclass
class DebugState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    breakpoints: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # run → the tracer's paused payload (checked; its thumbnails apart, under "thumbs") + sid
    paused: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: dict[str, str] = field(default_factory=dict)  # /debug sid → run

    def paused_node(self, run: str, node: int, order: int | None = None) -> tuple[dict[str, Any] | None,
                                                                                 dict[str, Any] | None]:
        """(where the run is paused, one node run so far with its thumbnails); (None, None) when the run
        is not paused, (paused, None) when that node has not run yet in the paused backward. The node's
        newest run, or the one at execution position `order`. Its tensors carry `"thumb"`: the
        `encode_array` map the tracer sent, or None (over the tracer's budget, or no thumbnail)."""
        with self.lock:
            p = self.paused.get(run)
            if p is None:
                return None, None
            where = {"run": run, "step": p["step"], "node": p["node"], "executed": p["executed"]}
            nodes, thumbs = p["nodes"], p["thumbs"]
            pos = next((k for k in range(len(nodes) - 1, -1, -1) if nodes[k]["id"] == node
                        and (order is None or nodes[k]["order"] == order)), None)
            if pos is None:
                return where, None
            n = nodes[pos]
            doc = {**n, "runs": sum(1 for m in nodes if m["id"] == node)}
            for kind in SLOTS:
                ts = n[kind]
                doc[kind] = None if ts is None else [
                    None if t is None else {**t, "thumb": thumbs.get((pos, kind, j))} for j, t in enumerate(ts)]
            return where, doc


def _error(message: str, status: int) -> Response:
    resp = jsonify({"error": message})
    resp.status_code = status
    return resp


def _foreign_origin() -> str | None:
    """The request's Origin when it is not this server's own (None when absent or the same)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return None  # scripts and curl send none; browsers send one on every cross-site POST
    parts = urlsplit(origin)
    if parts.scheme in ("http", "https") and parts.netloc.lower() == request.host.lower():
        return None
    return origin


class DebugNamespace(Namespace):
    """`/debug`: each tracer says `hello` for its run (and gets the run's breakpoints back), then
    sends `paused` when its backward stops at one; the server sends `breakpoints` and `resume`."""

    def __init__(self, namespace: str, app_state: Any, debug: DebugState, notify: Any) -> None:
        super().__init__(namespace)
        self.app_state, self.debug, self.notify = app_state, debug, notify

    def trigger_event(self, event: str, *args: Any) -> Any:
        if event in ("connect", "disconnect") or event in DEBUG_EVENTS:
            try:
                return super().trigger_event(event, *args)
            except protocol.ProtocolError as exc:
                log.warning("gradscape: %s %s refused: %s", NAMESPACE, event, exc)
                return {"ok": False, "error": str(exc)}
            except ConnectionRefusedError:
                raise
            except Exception as exc:  # a bug: still an answer, so a paused tracer does not wait on it
                log.exception("gradscape: %s %s failed", NAMESPACE, event)
                return {"ok": False, "error": f"server error on {event!r}: {type(exc).__name__}: {exc}"}
        return {"ok": False, "error": f"unknown event {event!r}; {NAMESPACE} handles {list(DEBUG_EVENTS)}"}

    def on_connect(self, auth: Any = None) -> None:
        if not self.app_state.token_ok(auth.get("token") if isinstance(auth, dict) else None):
            raise ConnectionRefusedError("gradscape: missing or wrong token")

    def on_disconnect(self, reason: Any = None) -> None:
        sid = request.sid  # type: ignore[attr-defined]
        with self.debug.lock:
            run = self.debug.sessions.pop(sid, None)
            gone = run is not None and self.debug.paused.get(run, {}).get("sid") == sid
            if gone:
                del self.debug.paused[run]  # type: ignore[arg-type]
        if gone:
            self.notify("paused", run)

    def on_hello(self, msg: Any) -> dict[str, Any]:
        protocol.check_envelope(msg, "hello")
        run = msg["run"]
        with self.debug.lock:
            self.debug.sessions[request.sid] = run  # type: ignore[attr-defined]
            points = list(self.debug.breakpoints.get(run, []))
        join_room(run)
        return {"ok": True, "breakpoints": points}

    def on_paused(self, msg: Any) -> dict[str, Any]:
        payload = protocol.check_envelope(msg, "paused")
        run = msg["run"]
        step = payload.get("step")
        node = payload.get("node")
        executed = payload.get("executed")
        nodes = payload.get("nodes")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise protocol.ProtocolError(f"paused.payload.step: expected a non-negative int, got {step!r}")
        if not isinstance(node, dict) or not isinstance(node.get("id"), int) or not isinstance(node.get("name"), str):
            raise protocol.ProtocolError("paused.payload.node: expected {id: int, name: str, module, source}")
        if isinstance(executed, bool) or not isinstance(executed, int) or executed < 0:
            raise protocol.ProtocolError(f"paused.payload.executed: expected a non-negative int, got {executed!r}")
        if not isinstance(nodes, list) or len(nodes) > MAX_PAUSED_NODES or not all(isinstance(n, dict) for n in nodes):
            raise protocol.ProtocolError(f"paused.payload.nodes: expected a list of at most {MAX_PAUSED_NODES} maps")
        listing, thumbs = check_paused_nodes(nodes)
        info = {"id": node["id"], "name": node["name"], "module": _str_or_none(node.get("module")),
                "source": _str_or_none(node.get("source"))}
        with self.debug.lock:
            self.debug.paused[run] = {"step": step, "node": info, "executed": executed, "nodes": listing,
                                      "thumbs": thumbs, "sid": request.sid,  # type: ignore[attr-defined]
                                      "since": time.time()}
        self.notify("paused", run)
        return {"ok": True}


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _bad(where: str, what: str, v: Any) -> protocol.ProtocolError:
    shown = repr(v)
    return protocol.ProtocolError(f"paused.payload.{where}: expected {what}, got "
                                  f"{shown if len(shown) <= 60 else shown[:60] + '…'}")


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _bad(where, "a non-negative int", v)
    return v


def _opt_str(v: Any, where: str) -> str | None:
    if v is not None and not isinstance(v, str):
        raise _bad(where, "a string or null", v)
    return v


def _strs(v: Any, where: str) -> list[str] | None:
    if v is not None and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
        raise _bad(where, "a list of strings or null", v)
    return v


def _check_tensor(t: Any, where: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """One gradient of the partial backward: (its listing, without the thumbnail; the thumbnail's
    `encode_array` map, checked by `decode_array`, or None)."""
    if t is None:
        return None, None
    if not isinstance(t, dict):
        raise _bad(where, "a map {shape, dtype, stats, view, thumb} or null", t)
    shape = t.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_RANK \
            or not all(type(d) is int and d >= 0 for d in shape):
        raise _bad(f"{where}.shape", f"a list of at most {MAX_RANK} non-negative ints", shape)
    dtype = t.get("dtype")
    if not isinstance(dtype, str) or len(dtype) > protocol.MAX_NAME:
        raise _bad(f"{where}.dtype", "a dtype name", dtype)
    stats = t.get("stats")
    if not isinstance(stats, dict) or len(stats) > 32 or not all(
            isinstance(k, str) and (v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)))
            for k, v in stats.items()):
        raise _bad(f"{where}.stats", "a map of statistic names to numbers or null", stats)
    view = _opt_str(t.get("view"), f"{where}.view")
    thumb = t.get("thumb")
    if thumb is not None:
        try:
            a = decode_array(thumb, f"paused.payload.{where}.thumb")
        except TraceFormatError as exc:
            raise protocol.ProtocolError(str(exc)) from None
        if a.ndim != 2 or a.dtype.kind != "f" or a.size > MAX_THUMB_ELEMENTS:
            raise _bad(f"{where}.thumb", f"a 2-D float array of at most {MAX_THUMB_ELEMENTS} elements",
                       f"{a.dtype} {list(a.shape)}")
    # JSON has no NaN: a non-finite statistic is listed as null (the tracer already sends it so)
    clean = {k: (v if v is None or isinstance(v, int) or math.isfinite(v) else None) for k, v in stats.items()}
    return {"shape": shape, "dtype": dtype, "stats": clean, "view": view or ""}, thumb


def check_paused_nodes(nodes: list[Any]) -> tuple[list[dict[str, Any]], dict[tuple[int, str, int], Any]]:
    """The partial backward of a `paused` message, checked (NOTE [Paused heatmaps] in
    tracer/debug/breakpoints.py): (the nodes as `/paused/nodes` lists them, the thumbnails by (position,
    "grad_outputs" or "grad_inputs", slot)). Raises `ProtocolError` naming the first field that is
    wrong; the thumbnails together may not pass `MAX_PAUSED_THUMB_BYTES`."""
    listing: list[dict[str, Any]] = []
    thumbs: dict[tuple[int, str, int], Any] = {}
    total = 0
    for pos, n in enumerate(nodes):
        w = f"nodes[{pos}]"
        name = n.get("name")
        if not isinstance(name, str) or len(name) > protocol.MAX_NAME:
            raise _bad(f"{w}.name", "a node name", name)
        out: dict[str, Any] = {"id": _int(n.get("id"), f"{w}.id"), "name": name,
                               "kind": _opt_str(n.get("kind"), f"{w}.kind"),
                               "module": _opt_str(n.get("module"), f"{w}.module"),
                               "param": _opt_str(n.get("param"), f"{w}.param"),
                               "source": _opt_str(n.get("source"), f"{w}.source"),
                               "order": _int(n.get("order"), f"{w}.order"),
                               "pass": _int(n.get("pass", 0), f"{w}.pass"),
                               "labels": _strs(n.get("labels"), f"{w}.labels"),
                               "args": _strs(n.get("args"), f"{w}.args"),
                               "thumbs": n.get("thumbs") is True}
        for kind in SLOTS:
            ts = n.get(kind)
            if ts is None and kind == "grad_inputs":
                out[kind] = None
                continue
            if not isinstance(ts, list):
                raise _bad(f"{w}.{kind}", "a list" + (" or null" if kind == "grad_inputs" else ""), ts)
            items = []
            for j, t in enumerate(ts):
                item, thumb = _check_tensor(t, f"{w}.{kind}[{j}]")
                items.append(item)
                if thumb is not None:
                    total += len(thumb["data"])
                    if total > MAX_PAUSED_THUMB_BYTES:
                        raise protocol.ProtocolError(f"paused.payload.nodes: thumbnails of more than "
                                                     f"{MAX_PAUSED_THUMB_BYTES} bytes in all")
                    thumbs[(pos, kind, j)] = thumb
            out[kind] = items
        listing.append(out)
    return listing, thumbs


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


def register_debug(server: Flask, socketio: SocketIO, app_state: Any, store: Any) -> DebugState:
    """The breakpoint routes and the `/debug` namespace on one server."""
    debug = DebugState()

    def notify(event: str, run: str) -> None:
        # light: which run changed; the page reads the state from the JSON API
        socketio.emit(event, {"run": run, "at": time.time()}, namespace="/ui")

    def push(run: str) -> None:
        with debug.lock:
            points = list(debug.breakpoints.get(run, []))
        socketio.emit("breakpoints", {"breakpoints": points}, namespace=NAMESPACE, to=run)
        notify("breakpoints", run)

    def known(run: str) -> bool:
        if run in app_state.known_runs or run in list(app_state.sessions.values()):
            return True
        with debug.lock:
            if run in debug.sessions.values():
                return True
        return any(r["run"] == run for r in store.runs())

    socketio.on_namespace(DebugNamespace(NAMESPACE, app_state, debug, notify))

    def catchup() -> list[tuple[str, dict[str, Any]]]:
        # a page that just (re)connected: which runs have breakpoints or are paused (it reads those)
        with debug.lock:
            runs = sorted(set(debug.paused) | {r for r, p in debug.breakpoints.items() if p})
        return [("paused", {"runs": runs, "catchup": True, "at": time.time()})]

    app_state.debug_catchup = catchup

    def gate(run: str, write: bool) -> Response | None:
        if write:
            origin = _foreign_origin()
            if origin is not None:
                return _error(f"cross-origin request from {origin!r} refused: breakpoints can only be set from "
                              f"this server's own page", 403)
        if not known(run):
            return _error(f"no run {run!r} (no stored step and no tracer connected for it)", 404)
        return None

    def body() -> dict[str, Any]:
        try:
            data = request.get_json(force=True, silent=True)
        except RecursionError:  # silent=True covers parse errors, not a body nested past the parser's depth
            raise ValueError("the body is nested too deeply to be a breakpoint or a resume request") from None
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return data

    all_methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]

    def run_route(path: str, allowed: tuple[str, ...], writes: tuple[str, ...] = ()) -> Callable[[Any], Any]:
        """A route under one run: any other method is answered 405 naming the ones it takes, then the
        gate (`writes`: the methods that change something, refused from another origin)."""
        use = allowed[0] if len(allowed) == 1 else ", ".join(allowed[:-1]) + " or " + allowed[-1]

        def wrap(fn: Callable[..., Response]) -> Callable[..., Response]:
            @functools.wraps(fn)
            def view(run: str, **kw: Any) -> Response:
                if request.method not in allowed:
                    return _error(f"{request.method} is not allowed here; use {use}", 405)
                refused = gate(run, request.method in writes)
                if refused is not None:
                    return refused
                return fn(run, **kw)
            server.route(path, methods=all_methods)(view)
            return view
        return wrap

    @run_route("/api/runs/<run>/breakpoints", ("GET", "POST", "DELETE"), writes=("POST", "DELETE"))
    def api_breakpoints(run: str) -> Response:
        if request.method == "GET":
            with debug.lock:
                return jsonify({"run": run, "breakpoints": list(debug.breakpoints.get(run, []))})
        if request.method == "DELETE":
            with debug.lock:
                debug.breakpoints.pop(run, None)
            push(run)
            return jsonify({"run": run, "breakpoints": []})
        try:
            bp = check_breakpoint(body())
        except ValueError as exc:
            return _error(str(exc), 400)
        with debug.lock:
            points = debug.breakpoints.setdefault(run, [])
            if bp not in points:
                if len(points) >= MAX_BREAKPOINTS:
                    return _error(f"run {run!r} already has {MAX_BREAKPOINTS} breakpoints", 400)
                points.append(bp)
            out = list(points)
        push(run)
        resp = jsonify({"run": run, "breakpoints": out})
        resp.status_code = 201
        return resp

    @run_route("/api/runs/<run>/paused", ("GET",))
    def api_paused(run: str) -> Response:
        with debug.lock:
            p = debug.paused.get(run)
            if p is None:
                return jsonify({"paused": False})
            return jsonify({"paused": True, "step": p["step"], "node": p["node"], "executed": p["executed"]})

    @run_route("/api/runs/<run>/paused/nodes", ("GET",))
    def api_paused_nodes(run: str) -> Response:
        with debug.lock:
            p = debug.paused.get(run)
            if p is None:
                return _error(f"run {run!r} is not paused", 409)
            return jsonify({"run": run, "step": p["step"], "node": p["node"], "executed": p["executed"],
                            "nodes": p["nodes"]})

    @run_route("/api/runs/<run>/paused/nodes/<node>", ("GET",))
    def api_paused_node(run: str, node: str) -> Response:
        try:
            nid = check_index(node, "node")
            order_arg = request.args.get("order")
            order = None if order_arg is None else check_index(order_arg, "order")
        except BadParameter as exc:
            return _error(str(exc), 400)
        where, doc = debug.paused_node(run, nid, order)
        if where is None:
            return _error(f"run {run!r} is not paused", 409)
        if doc is None:
            at = "" if order is None else f" at execution position {order}"
            return _error(f"node {nid} has not run{at} in the paused backward of step {where['step']} "
                          f"({where['executed']} nodes run so far)", 404)
        for kind in SLOTS:
            if doc[kind] is not None:
                doc[kind] = [None if t is None else {**t, "thumb": t["thumb"] and thumb_json(t["thumb"])}
                             for t in doc[kind]]
        return jsonify({"run": run, "step": where["step"], "executed": where["executed"], "paused_at": where["node"],
                        "node": doc})

    @run_route("/api/runs/<run>/resume", ("POST",), writes=("POST",))
    def api_resume(run: str) -> Response:
        try:
            mode = body().get("mode")
        except ValueError as exc:
            return _error(str(exc), 400)
        if mode not in ("step", "continue"):
            return _error(f'"mode" must be "step" or "continue", got {mode!r}', 400)
        with debug.lock:
            p = debug.paused.pop(run, None)
        if p is None:
            return _error(f"run {run!r} is not paused", 409)
        socketio.emit("resume", {"mode": mode}, namespace=NAMESPACE, to=p["sid"])
        notify("paused", run)
        return jsonify({"run": run, "resumed": mode})

    return debug
