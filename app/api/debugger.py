"""Live breakpoints: the JSON routes (the tracers' side is `DebugNamespace`, the state `DebugState`).

    POST   /api/runs/<run>/breakpoints     add one: {"on": "node", "name": "AddmmBackward0"}, ...
    GET    /api/runs/<run>/breakpoints     the run's breakpoints
    DELETE /api/runs/<run>/breakpoints     clear them
    GET    /api/runs/<run>/paused          {"paused": true, "step", "node", "executed"} or {"paused": false}
    GET    /api/runs/<run>/paused/nodes    the partial backward: every node run so far, with statistics
    GET    /api/runs/<run>/paused/nodes/<id>  one of them with its thumbnails' values (?order=k: that run)
    POST   /api/runs/<run>/resume          {"mode": "step"} or {"mode": "continue"}

The server holds each run's breakpoints in memory and pushes the whole list to the run's tracers,
which connect to `/debug` (see NOTE [Breakpoints] in tracer/record/debug/breakpoints.py). A paused tracer sends the
partial backward in its `paused` message (with the thumbnails of its newest nodes: NOTE [Paused
heatmaps]); it is checked (`protocol.check_paused`), kept in memory until the run resumes or its
tracer goes away, and served by `/paused/nodes` and `/paused/nodes/<id>`. The page hears `paused` /
`breakpoints` on `/ui` (they only say which run changed) and reads the state from these routes.

Writes need the token when the server has one (the app's token gate) and are refused with 403 when
the request's `Origin` is not the server's own: another site's page must not pause anyone's
training. Bad input is answered with JSON 4xx naming what was wrong, never HTML (`errors`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, jsonify, request
from flask_socketio import SocketIO

from gradscape.app.api.errors import ALL_METHODS, BadParameter, Conflict, Forbidden, NotAllowed, NotFound, check_index
from gradscape.app.api.forms import thumb_json
from gradscape.app.serving.security import foreign_origin
from gradscape.app.serving.state import ServerState, TooManyBreakpoints
from gradscape.tracer import protocol


def _body() -> dict[str, Any]:
    try:
        data = request.get_json(force=True, silent=True)
    except RecursionError:  # silent=True covers parse errors, not a body nested past the parser's depth
        raise BadParameter("the body is nested too deeply to be a breakpoint or a resume request") from None
    if not isinstance(data, dict):
        raise BadParameter("the body must be a JSON object")
    return data


def _run_route(server: Flask, state: ServerState, path: str, allowed: tuple[str, ...],
               writes: tuple[str, ...] = ()) -> Callable[[Any], Any]:
    """A route under one run: any other method is answered 405 naming the ones it takes; `writes` (the
    methods that change something) are refused from another origin; a run the server does not know is 404."""
    use = allowed[0] if len(allowed) == 1 else ", ".join(allowed[:-1]) + " or " + allowed[-1]

    def wrap(fn: Callable[..., Response]) -> Callable[..., Response]:
        @functools.wraps(fn)
        def view(run: str, **kw: Any) -> Response:
            if request.method not in allowed:
                raise NotAllowed(f"{request.method} is not allowed here; use {use}")
            origin = foreign_origin() if request.method in writes else None
            if origin is not None:
                raise Forbidden(f"cross-origin request from {origin!r} refused: breakpoints can only be set from "
                                f"this server's own page")
            if not state.has_run(run):
                raise NotFound(f"no run {run!r} (no stored step and no tracer connected for it)")
            return fn(run, **kw)
        server.route(path, methods=ALL_METHODS)(view)
        return view
    return wrap


def register_debugger(server: Flask, socketio: SocketIO, state: ServerState) -> None:
    """The breakpoint routes on one server."""
    route = functools.partial(_run_route, server, state)
    _breakpoint_routes(route, socketio, state)
    _pause_routes(route, socketio, state)


def _breakpoint_routes(route: Callable[..., Any], socketio: SocketIO, state: ServerState) -> None:
    debug = state.debug

    def push(run: str) -> None:
        socketio.emit("breakpoints", protocol.breakpoints_message(debug.points(run)),
                      namespace=protocol.DEBUG_NAMESPACE, to=run)
        state.notifier.changed("breakpoints", run)

    @route("/api/runs/<run>/breakpoints", ("GET", "POST", "DELETE"), writes=("POST", "DELETE"))
    def api_breakpoints(run: str) -> Response:
        if request.method == "GET":
            return jsonify({"run": run, "breakpoints": debug.points(run)})
        if request.method == "DELETE":
            debug.clear_points(run)
            push(run)
            return jsonify({"run": run, "breakpoints": []})
        try:
            points = debug.add_point(run, protocol.check_breakpoint(_body()))
        except (ValueError, TooManyBreakpoints) as exc:
            raise BadParameter(str(exc)) from None
        push(run)
        resp = jsonify({"run": run, "breakpoints": points})
        resp.status_code = 201
        return resp


def _pause_routes(route: Callable[..., Any], socketio: SocketIO, state: ServerState) -> None:
    debug = state.debug

    @route("/api/runs/<run>/paused", ("GET",))
    def api_paused(run: str) -> Response:
        where = debug.where(run)
        return jsonify({"paused": False} if where is None else {"paused": True, **where})

    @route("/api/runs/<run>/paused/nodes", ("GET",))
    def api_paused_nodes(run: str) -> Response:
        listing = debug.listing(run)
        if listing is None:
            raise Conflict(f"run {run!r} is not paused")
        return jsonify({"run": run, **listing})

    @route("/api/runs/<run>/paused/nodes/<node>", ("GET",))
    def api_paused_node(run: str, node: str) -> Response:
        nid = check_index(node, "node")
        order_arg = request.args.get("order")
        order = None if order_arg is None else check_index(order_arg, "order")
        where, doc = debug.paused_node(run, nid, order)
        if where is None:
            raise Conflict(f"run {run!r} is not paused")
        if doc is None:
            at = "" if order is None else f" at execution position {order}"
            raise NotFound(f"node {nid} has not run{at} in the paused backward of step {where['step']} "
                           f"({where['executed']} nodes run so far)")
        for kind in protocol.SLOTS:
            if doc[kind] is not None:
                doc[kind] = [None if t is None else {**t, "thumb": t["thumb"] and thumb_json(t["thumb"])}
                             for t in doc[kind]]
        return jsonify({"run": run, "step": where["step"], "executed": where["executed"], "paused_at": where["node"],
                        "node": doc})

    @route("/api/runs/<run>/resume", ("POST",), writes=("POST",))
    def api_resume(run: str) -> Response:
        try:
            mode = protocol.check_resume_mode(_body().get("mode"))
        except ValueError as exc:
            raise BadParameter(str(exc)) from None
        sid = debug.resume(run)
        if sid is None:
            raise Conflict(f"run {run!r} is not paused")
        socketio.emit("resume", protocol.resume_message(mode), namespace=protocol.DEBUG_NAMESPACE, to=sid)
        state.notifier.changed("paused", run)
        return jsonify({"run": run, "resumed": mode})
