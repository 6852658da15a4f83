"""Live breakpoints: the server side (routes, per-run state, the tracers' `/debug` namespace).

    POST   /api/runs/<run>/breakpoints     add one: {"on": "node", "name": "AddmmBackward0"}, ...
    GET    /api/runs/<run>/breakpoints     the run's breakpoints
    DELETE /api/runs/<run>/breakpoints     clear them
    GET    /api/runs/<run>/paused          {"paused": true, "step", "node", "executed"} or {"paused": false}
    GET    /api/runs/<run>/paused/nodes    the partial backward: every node run so far, with statistics
    POST   /api/runs/<run>/resume          {"mode": "step"} or {"mode": "continue"}

The server holds each run's breakpoints in memory and pushes the whole list to the run's tracers,
which connect to `/debug` (see NOTE [Breakpoints] in tracer._breakpoints). A paused tracer sends the
partial backward in its `paused` message; it is kept here, in memory, until the run resumes or its
tracer goes away, and served by `/paused/nodes`. The page hears `paused` / `breakpoints` on `/ui`
(they only say which run changed; on connecting, one `paused` catch-up lists the runs that are paused
or have breakpoints) and reads the state from these routes.

Writes need the token when the server has one (the app's token gate) and are refused with 403 when
the request's `Origin` is not the server's own: another site's page must not pause anyone's
training. Bad input is answered with JSON 4xx naming what was wrong, never HTML.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, jsonify, request
from flask_socketio import Namespace, SocketIO, join_room

from tracer import protocol
from tracer._breakpoints import NAMESPACE, check_breakpoint

MAX_BREAKPOINTS = 64
MAX_PAUSED_NODES = 200_000
DEBUG_EVENTS = ("hello", "paused")


@dataclass
class DebugState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    breakpoints: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    paused: dict[str, dict[str, Any]] = field(default_factory=dict)  # run → the tracer's paused payload + sid
    sessions: dict[str, str] = field(default_factory=dict)  # /debug sid → run


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
                return {"ok": False, "error": str(exc)}
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
        info = {"id": node["id"], "name": node["name"], "module": _str_or_none(node.get("module")),
                "source": _str_or_none(node.get("source"))}
        with self.debug.lock:
            self.debug.paused[run] = {"step": step, "node": info, "executed": executed, "nodes": nodes,
                                      "sid": request.sid, "since": time.time()}  # type: ignore[attr-defined]
        self.notify("paused", run)
        return {"ok": True}


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


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

    @server.route("/api/runs/<run>/breakpoints", methods=all_methods)
    def api_breakpoints(run: str) -> Response:
        if request.method not in ("GET", "POST", "DELETE"):
            return _error(f"{request.method} is not allowed here; use GET, POST or DELETE", 405)
        refused = gate(run, request.method != "GET")
        if refused is not None:
            return refused
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

    @server.route("/api/runs/<run>/paused", methods=all_methods)
    def api_paused(run: str) -> Response:
        if request.method != "GET":
            return _error(f"{request.method} is not allowed here; use GET", 405)
        refused = gate(run, False)
        if refused is not None:
            return refused
        with debug.lock:
            p = debug.paused.get(run)
            if p is None:
                return jsonify({"paused": False})
            return jsonify({"paused": True, "step": p["step"], "node": p["node"], "executed": p["executed"]})

    @server.route("/api/runs/<run>/paused/nodes", methods=all_methods)
    def api_paused_nodes(run: str) -> Response:
        if request.method != "GET":
            return _error(f"{request.method} is not allowed here; use GET", 405)
        refused = gate(run, False)
        if refused is not None:
            return refused
        with debug.lock:
            p = debug.paused.get(run)
            if p is None:
                return _error(f"run {run!r} is not paused", 409)
            return jsonify({"run": run, "step": p["step"], "node": p["node"], "executed": p["executed"],
                            "nodes": p["nodes"]})

    @server.route("/api/runs/<run>/resume", methods=all_methods)
    def api_resume(run: str) -> Response:
        if request.method != "POST":
            return _error(f"{request.method} is not allowed here; use POST", 405)
        refused = gate(run, True)
        if refused is not None:
            return refused
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
