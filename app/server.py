"""The gradscape server: one process serving the Dash page, the Socket.IO endpoint and the JSON API.

`create_app(store=...)` builds everything and returns a `GradscapeApp`: it unpacks as
`(dash_app, socketio)`, and `close()` stops its notifier thread and closes the trace file it opened.
There are no module globals, so tests build as many servers as they like. The tracer streams steps on `/tracer`
(`TracerNamespace`), every step is validated and written to the SQLite trace file in one
transaction, and the browser gets light notifications on `/ui` and reads data from the store.
See `tracer.protocol` for the messages and docs/api.md for the JSON API.

Security (docs/web-stack.md): bound to loopback by default; the Host header is checked on every request
(the Socket.IO origin check alone lets DNS rebinding through); a token is required when bound
anywhere else (generated if not given) and then checked on the socket connect, the JSON API and the
page (a `?token=` visit sets a cookie). Dash's version check is never enabled.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import dash
from flask import Flask, Response, request
from flask_socketio import Namespace, SocketIO, emit

from gradscape.app.api import register_api
from gradscape.app.history_api import receive_history, register_history_api
from gradscape.tracer import protocol
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire import TraceFormatError, step_from_wire, step_to_wire, unpack

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8050
    token: str | None = None  # required on every request when set
    allowed_hosts: tuple[str, ...] = ()  # extra Host names accepted besides loopback (and the bind host)
    notify_interval: float = 0.1  # /ui pushes are coalesced to at most ~10 Hz

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK

    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        base = f"http://{host}:{self.port}/"
        return base + (f"?token={self.token}" if self.token else "")


def resolve_token(host: str, token: str | None) -> str | None:
    """Loopback needs no token unless one is given; anywhere else one is required (generated)."""
    if token:
        return token
    return None if host in LOOPBACK else secrets.token_urlsafe(24)


class HostCheck:
    """WSGI middleware in front of everything (Dash, Socket.IO, API): refuse foreign Host headers."""

    def __init__(self, app: Callable[..., Any], allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = {h.lower() for h in allowed}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        host = environ.get("HTTP_HOST", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if host.startswith("[") and "]" in host:
            name = host[: host.index("]") + 1]
        if name.lower() not in self.allowed:
            body = f"gradscape: Host {host!r} is not served here (DNS rebinding protection)".encode()
            start_response("403 Forbidden", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            return [body]
        return self.app(environ, start_response)


class Notifier:
    """Coalesces /ui notifications and pushes them at most every `interval` seconds from one thread.
    A notification only says what changed; the page reads the current state from the store, so
    nothing is lost when several merge (Dash props are state, not events: docs/web-stack.md).

    A step notification names its rank when it is not 0 (`{"run", "step", "rank"}`): the page hears a
    prop change only when the value differs, and each rank of a distributed run stores the same step
    numbers, often one after the other."""

    def __init__(self, socketio: SocketIO, interval: float) -> None:
        self.socketio = socketio
        self.interval = interval
        self._lock = threading.Lock()
        self._steps: dict[tuple[str, int], int] = {}
        self._runs: list[str] = []
        self._tracers: dict[str, dict[str, Any]] = {}
        self._history: dict[tuple[str, int], int] = {}  # (run, rank) → the last step of its history rows
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Any = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = self.socketio.start_background_task(self._loop)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the push thread and wait (up to `timeout`) until it has ended."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and hasattr(thread, "join") and thread is not threading.current_thread():
            thread.join(timeout)

    def step(self, run: str, step: int, rank: int = 0) -> None:
        with self._lock:
            self._steps[(run, rank)] = max(step, self._steps.get((run, rank), -1))
        self._wake.set()

    def run(self, run: str) -> None:
        with self._lock:
            if run not in self._runs:
                self._runs.append(run)
        self._wake.set()

    def history(self, run: str, step: int, rank: int = 0) -> None:
        with self._lock:
            self._history[(run, rank)] = max(step, self._history.get((run, rank), -1))
        self._wake.set()

    def tracer(self, run: str, state: str, stats: dict[str, int]) -> None:
        with self._lock:
            self._tracers[run] = {"run": run, "state": state, **stats}
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                runs, self._runs = self._runs, []
                steps, self._steps = self._steps, {}
                tracers, self._tracers = self._tracers, {}
                history, self._history = self._history, {}
            for r in runs:
                self.socketio.emit("run", {"run": r}, namespace="/ui")
            for (r, rank), s in steps.items():
                self.socketio.emit("step", {"run": r, "step": s, **({"rank": rank} if rank else {})}, namespace="/ui")
            for t in tracers.values():
                self.socketio.emit("tracer", t, namespace="/ui")
            for (r, rank), s in history.items():
                note = {"run": r, "step": s, **({"rank": rank} if rank else {})}
                self.socketio.emit("history", note, namespace="/ui")
            time.sleep(self.interval)


@dataclass
class _Pending:
    run: str
    step: int
    chunks: int
    parts: dict[int, bytes] = field(default_factory=dict)
    size: int = 0


class TracerNamespace(Namespace):
    """`/tracer`: handshake, step chunks, status. Every handler answers an ack map."""

    def __init__(self, namespace: str, state: ServerState) -> None:
        super().__init__(namespace)
        self.state = state

    def trigger_event(self, event: str, *args: Any) -> Any:
        if event in ("connect", "disconnect") or event in protocol.TRACER_EVENTS:
            try:
                return super().trigger_event(event, *args)
            except protocol.ProtocolError as exc:
                return {"ok": False, "error": str(exc)}
            except ConnectionRefusedError:
                raise
            except Exception as exc:  # a bug or a store failure: still an answer, so the tracer never waits
                log.exception("gradscape: /tracer %s failed", event)
                return {"ok": False, "error": f"server error on {event!r}: {type(exc).__name__}: {exc}"}
        return {"ok": False, "error": f"unknown event {event!r}; the /tracer namespace handles "
                                      f"{list(protocol.TRACER_EVENTS)}"}

    def on_connect(self, auth: Any = None) -> None:
        if not self.state.token_ok(auth.get("token") if isinstance(auth, dict) else None):
            raise ConnectionRefusedError("gradscape: missing or wrong token")

    def on_disconnect(self, reason: Any = None) -> None:
        sid = request.sid  # type: ignore[attr-defined]
        run = self.state.sessions.pop(sid, None)
        with self.state.lock:
            for key in [k for k in self.state.pending if k[0] == sid]:
                del self.state.pending[key]
        if run is not None:
            self.state.notifier.tracer(run, "gone", self.state.tracer_stats.get(run, {}))

    def on_hello(self, msg: Any) -> dict[str, Any]:
        payload = protocol.check_envelope(msg, "hello")
        protocol.check_hello(payload)
        run = msg["run"]
        self.state.sessions[request.sid] = run  # type: ignore[attr-defined]
        self.state.notifier.tracer(run, "connected", self.state.tracer_stats.get(run, {}))
        return {"ok": True, "protocol": protocol.PROTOCOL_VERSION, "max_message": protocol.MAX_MESSAGE,
                "chunk": protocol.CHUNK_BYTES}

    def on_step_chunk(self, msg: Any) -> dict[str, Any]:
        payload = protocol.check_envelope(msg, "step_chunk")
        step, chunk, chunks, data = protocol.check_chunk(payload)
        run = msg["run"]
        key = (request.sid, run, step)  # type: ignore[attr-defined]
        st = self.state
        with st.lock:
            p = st.pending.get(key)
            if p is None or p.chunks != chunks:
                p = st.pending[key] = _Pending(run, step, chunks)
            if chunk in p.parts:
                raise protocol.ProtocolError(f"step_chunk: chunk {chunk} of step {step} was already received")
            p.parts[chunk] = data
            p.size += len(data)
            if p.size > protocol.MAX_STEP_BYTES:
                del st.pending[key]
                raise protocol.ProtocolError(f"step_chunk: step {step} exceeds {protocol.MAX_STEP_BYTES} bytes")
            if len(p.parts) < chunks:
                return {"ok": True, "step": step, "chunk": chunk, "stored": False}
            del st.pending[key]
        blob = b"".join(p.parts[i] for i in range(chunks))
        try:
            trace = step_from_wire(unpack(blob))  # every field checked (shapes, dtypes, byte lengths, indices)
        except TraceFormatError as exc:
            raise protocol.ProtocolError(f"step_chunk: step {step} is malformed: {exc}") from exc
        if trace.rank is not None and not 0 <= trace.rank < (trace.world_size or trace.rank + 1):
            raise protocol.ProtocolError(f"step_chunk: rank {trace.rank} is outside 0 .. world_size - 1 "
                                         f"(world_size {trace.world_size})")
        if trace.run != run or trace.step != step:
            raise protocol.ProtocolError(f"step_chunk: data is run {trace.run!r} step {trace.step}, "
                                         f"the message says run {run!r} step {step}")
        new_run = run not in st.known_runs
        st.store.write_wire(step_to_wire(trace))  # what is stored is the schema's own form, unknown keys dropped
        st.known_runs.add(run)
        if new_run:
            st.notifier.run(run)
        st.notifier.step(run, step, trace.rank or 0)
        return {"ok": True, "step": step, "chunk": chunk, "stored": True}

    def on_history(self, msg: Any) -> dict[str, Any]:
        return receive_history(self.state, msg)  # the monitor's rows (app/history_api.py)

    def on_status(self, msg: Any) -> dict[str, Any]:
        payload = protocol.check_envelope(msg, "status")
        stats = protocol.check_status(payload)
        self.state.tracer_stats[msg["run"]] = stats
        self.state.notifier.tracer(msg["run"], "connected", stats)
        return {"ok": True}


class UINamespace(Namespace):
    """`/ui`: the browser listens here; it sends nothing but its token."""

    def __init__(self, namespace: str, state: ServerState) -> None:
        super().__init__(namespace)
        self.state = state

    def on_connect(self, auth: Any = None) -> None:
        token = auth.get("token") if isinstance(auth, dict) else None
        if not self.state.token_ok(token or request.cookies.get("gradscape_token")):
            raise ConnectionRefusedError("gradscape: missing or wrong token")
        # Catch up a page that just (re)connected: steps may have been stored between its layout being
        # served and now, or while it was offline, with no notification it could hear. It arrives as a
        # `step` event, read like any other by the page (`gradscape.liveSteps` in assets/player.js).
        # (`at` makes every catch-up a new value: Dash fires a callback only when a prop changes)
        emit("step", {"run": None, "step": None, "catchup": True, "at": time.time()})
        for event, payload in getattr(self.state, "debug_catchup", list)():  # breakpoints (app/debug.py)
            emit(event, payload)


@dataclass
class ServerState:
    store: TraceStore
    config: ServerConfig
    notifier: Notifier
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: dict[tuple[str, str, int], _Pending] = field(default_factory=dict)
    sessions: dict[str, str] = field(default_factory=dict)
    tracer_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    known_runs: set[str] = field(default_factory=set)
    owns_store: bool = False  # create_app opened it, so close() closes it
    closed: bool = False

    def token_ok(self, token: Any) -> bool:
        want = self.config.token
        if not want:
            return True
        return isinstance(token, str) and hmac.compare_digest(token.encode(), want.encode())


def _request_token() -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return auth[7:]
    return request.args.get("token") or request.cookies.get("gradscape_token")


class GradscapeDash(dash.Dash):
    """`dash.Dash` with two savings on the page load (measured by bench/ui.py):

    - `/_dash-layout` is answered from a cache while `layout_key()` is unchanged (the page is the
      newest step of the store, so the key is the store's runs and their last update): a reload
      does not rebuild and re-serialise the step's elements and execution order;
    - dash_table's loader is left out of the page's scripts: the page has no DataTable.
    """

    layout_key: Callable[[], Any] | None = None
    _layout_cache: tuple[Any, bytes] | None = None

    def serve_layout(self) -> Any:
        if self.layout_key is None:
            return super().serve_layout()
        key = self.layout_key()  # taken before the layout is built: a write in between only rebuilds it once more
        cached = self._layout_cache
        if cached is None or cached[0] != key:
            cached = self._layout_cache = (key, super().serve_layout().get_data())
        return Response(cached[1], mimetype="application/json")

    def interpolate_index(self, metas: str = "", title: str = "", css: str = "", config: str = "", scripts: str = "",
                          app_entry: str = "", favicon: str = "", renderer: str = "") -> str:
        scripts = "\n".join(line for line in scripts.split("\n") if "/dash_table/" not in line)
        scripts = _ids_script() + "\n" + scripts
        return str(super().interpolate_index(metas=metas, title=title, css=css, config=config, scripts=scripts,
                                             app_entry=app_entry, favicon=favicon, renderer=renderer))


def _ids_script() -> str:
    """`window.gradscapeIds`: the page's element ids (app/ui/ids.py) for its scripts in assets/, which read
    them from there instead of repeating them; written before the scripts that use them."""
    from gradscape.app.ui import ids

    return "<script>window.gradscapeIds = " + json.dumps(ids.table()).replace("</", "<\\/") + ";</script>"


class GradscapeApp(NamedTuple):
    """What `create_app` returns: unpacks as `(dash_app, socketio)`; `close()` when done with it."""

    dash: dash.Dash
    socketio: SocketIO

    @property
    def state(self) -> ServerState:
        return self.dash._gradscape_state  # type: ignore[attr-defined, no-any-return]

    def close(self) -> None:
        """Stop the notifier thread; close the trace file if `create_app` opened it. Idempotent."""
        state = self.state
        state.notifier.stop()
        if state.owns_store and not state.closed:
            state.closed = True
            state.store.close()


def create_app(store: str | TraceStore = "gradscape.sqlite", config: ServerConfig | None = None,
               layout: Callable[[], Any] | None = None) -> GradscapeApp:
    """Build the Dash app and its SocketIO around one trace file. Nothing global is touched."""
    config = config or ServerConfig()
    owns_store = not isinstance(store, TraceStore)
    store = store if isinstance(store, TraceStore) else TraceStore(store)
    server = Flask("gradscape")
    # Dash's annotations leave out two values it documents: a Flask instance as `server` (they say
    # bool | Callable[[], Any]) and None as `update_title` (no "Updating..." title while callbacks run).
    dash_options: dict[str, Any] = {"server": server, "update_title": None}
    app = GradscapeDash("gradscape", assets_folder=_assets_folder(), title="gradscape",
                        suppress_callback_exceptions=True, **dash_options)
    socketio = SocketIO(server, async_mode="threading", async_handlers=False,
                        max_http_buffer_size=protocol.MAX_MESSAGE, cors_allowed_origins=None,
                        logger=False, engineio_logger=False)
    notifier = Notifier(socketio, config.notify_interval)
    state = ServerState(store=store, config=config, notifier=notifier, owns_store=owns_store)
    state.known_runs.update(r["run"] for r in store.runs())
    socketio.on_namespace(TracerNamespace("/tracer", state))
    socketio.on_namespace(UINamespace("/ui", state))
    register_history_api(server, store)  # before register_api: its catch-all answers unknown /api/ paths
    register_api(server, store, state)
    from gradscape.app.debug import register_debug  # breakpoints: routes, state and the tracers' /debug namespace

    debug = register_debug(server, socketio, state, store)
    state.debug = debug  # type: ignore[attr-defined]
    if layout is not None:
        app.layout = layout
    else:
        from gradscape.app.ui import callbacks, debugger, graph_controls, page

        ui_data = callbacks.register(app, store)
        graph_controls.register(app, ui_data)
        debugger.register(app, debug)  # breakpoints (app/ui/debugger.py)
        from gradscape.app.ui import timeline

        timeline.register(app, store)  # the run's history (app/ui/timeline.py)
        app.layout = lambda: page.layout(config.token, callbacks.initial_state(ui_data))
        app.layout_key = lambda: tuple((r["run"], r["updated"], r["steps"], r["last_step"]) for r in store.runs())

    @server.before_request
    def _token_gate() -> Response | None:
        if not config.token or request.path.startswith("/socket.io"):
            return None  # socket namespaces check the token on connect
        tok = _request_token()
        if not state.token_ok(tok):
            if request.path.startswith("/api/"):
                return Response('{"error": "missing or wrong token"}', status=401, mimetype="application/json")
            return Response("gradscape: open the URL printed at start-up (it carries the token)", status=401)
        return None

    @server.after_request
    def _remember_token(resp: Response) -> Response:
        if config.token and request.args.get("token") and state.token_ok(request.args.get("token")):
            resp.set_cookie("gradscape_token", request.args["token"], httponly=False, samesite="Strict")
        return resp

    allowed = set(LOOPBACK) | set(config.allowed_hosts)
    if not config.loopback and config.host not in ("0.0.0.0", "::"):
        allowed.add(config.host)
    if config.host in ("0.0.0.0", "::"):
        allowed = {"*"}
    if "*" not in allowed:
        server.wsgi_app = HostCheck(server.wsgi_app, allowed)  # type: ignore[method-assign]
    notifier.start()
    app._gradscape_state = state  # type: ignore[attr-defined]  # GradscapeApp.state
    return GradscapeApp(app, socketio)


def _assets_folder() -> str:
    """The page's assets: `gradscape/assets/`, which in a source checkout is a link to the repository's
    `assets/` and in a built package holds a copy of it."""
    from pathlib import Path

    folder = Path(__file__).parent.parent / "assets"
    if not (folder / "player.js").is_file():
        raise FileNotFoundError(f"gradscape: the page's assets (player.js, gradscape.css) are not in {folder}; "
                                "reinstall gradscape")
    return str(folder)
