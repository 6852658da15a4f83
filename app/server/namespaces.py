"""The Socket.IO namespaces (`tracer.protocol` defines their messages), on one base: `ProtocolNamespace`
checks the token on connect and answers every event with an ack map, a handler's error included.

    /tracer  `TracerNamespace`  the tracer's step stream: hello, step chunks, status, history
    /debug   `DebugNamespace`   the tracer's breakpoint link: hello, paused (the server sends breakpoints, resume)
    /ui      `UINamespace`      the page listens; on connecting it is caught up
"""

from __future__ import annotations

import logging
from typing import Any

from flask import request
from flask_socketio import Namespace, emit, join_room

from gradscape.app.serving.security import TOKEN_COOKIE
from gradscape.app.serving.state import ChunkedStep, ServerState
from gradscape.tracer import protocol
from gradscape.tracer.collector import collector_paused
from gradscape.tracer.wire import TraceFormatError, step_from_wire, unpack
from gradscape.tracer.wire.column_check import column_step

log = logging.getLogger(__name__)


def _sid() -> str:
    return request.sid  # type: ignore[attr-defined, no-any-return]


def _check_head(run: str, step: int, data_run: str, data_step: int, rank: int | None, world_size: int | None) -> None:
    """The step's run, step and rank agree with the message that carried it."""
    if rank is not None and not 0 <= rank < (world_size or rank + 1):
        raise protocol.ProtocolError(f"step_chunk: rank {rank} is outside 0 .. world_size - 1 "
                                     f"(world_size {world_size})")
    if data_run != run or data_step != step:
        raise protocol.ProtocolError(f"step_chunk: data is run {data_run!r} step {data_step}, "
                                     f"the message says run {run!r} step {step}")


class ProtocolNamespace(Namespace):
    """A namespace whose clients present the server's token on connect and whose every event (`events`)
    is answered: the handler's ack, or `protocol.refused` naming what was wrong. A bug or a store failure
    is answered too, so a tracer never waits on an answer that does not come."""

    events: tuple[str, ...] = ()

    def __init__(self, namespace: str, state: ServerState) -> None:
        super().__init__(namespace)
        self.state = state

    def trigger_event(self, event: str, *args: Any) -> Any:
        if event in ("connect", "disconnect") or event in self.events:
            try:
                return super().trigger_event(event, *args)
            except protocol.ProtocolError as exc:
                log.info("gradscape: %s %s refused: %s", self.namespace, event, exc)
                return protocol.refused(str(exc))
            except ConnectionRefusedError:
                raise
            except Exception as exc:
                log.exception("gradscape: %s %s failed", self.namespace, event)
                return protocol.refused(f"server error on {event!r}: {type(exc).__name__}: {exc}")
        return protocol.refused(f"unknown event {event!r}; the {self.namespace} namespace handles {list(self.events)}")

    def token(self, auth: Any) -> Any:
        """The token a connecting client presents (in the connect's `auth`)."""
        return auth.get("token") if isinstance(auth, dict) else None

    def on_connect(self, auth: Any = None) -> None:
        if not self.state.config.token_ok(self.token(auth)):
            raise ConnectionRefusedError("gradscape: missing or wrong token")


class TracerNamespace(ProtocolNamespace):
    """`/tracer`: handshake, step chunks, status, the monitor's history (`protocol.stream`)."""

    events = protocol.TRACER_EVENTS

    def on_disconnect(self, reason: Any = None) -> None:
        sid = _sid()
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
        self.state.sessions[_sid()] = run
        self.state.notifier.tracer(run, "connected", self.state.tracer_stats.get(run, {}))
        return protocol.hello_ack()

    @collector_paused()  # a whole step is unpacked, checked and stored (NOTE [Collector paused])
    def on_step_chunk(self, msg: Any) -> dict[str, Any]:
        payload = protocol.check_envelope(msg, "step_chunk")
        step, chunk, chunks, data = protocol.check_chunk(payload)
        run = msg["run"]
        whole = self._gather(run, step, chunk, chunks, data)
        if whole is None:
            return protocol.chunk_ack(step, chunk, stored=False)
        try:
            doc = unpack(whole)
            columns = isinstance(doc, dict) and "columns" in doc
            if columns:  # NOTE [Column document]: its fields checked in place, no `StepTrace` made
                stored, arrays = column_step(doc)
                head = (stored["run"], stored["step"], stored["rank"], stored["world_size"])
            else:
                trace = step_from_wire(doc)  # every field checked (shapes, dtypes, byte lengths, indices)
                head = (trace.run, trace.step, trace.rank, trace.world_size)
        except TraceFormatError as exc:
            raise protocol.ProtocolError(f"step_chunk: step {step} is malformed: {exc}") from exc
        _check_head(run, step, *head)
        if columns:
            self.state.store_columns(stored, arrays)  # the checked document: the schema's own form
            return protocol.chunk_ack(step, chunk, stored=True)
        try:  # an earlier release's tracer sent maps: stored as columns (NOTE [Columns of any step])
            self.state.store_step(trace)
        except TraceFormatError as exc:
            raise protocol.ProtocolError(f"step_chunk: step {step} cannot be stored: {exc}") from exc
        return protocol.chunk_ack(step, chunk, stored=True)

    def _gather(self, run: str, step: int, chunk: int, chunks: int, data: bytes) -> bytes | None:
        """Keep one chunk; the step's whole data once every chunk arrived, else None."""
        key = (_sid(), run, step)
        st = self.state
        with st.lock:
            p = st.pending.get(key)
            if p is None or p.chunks != chunks:
                p = st.pending[key] = ChunkedStep(run, step, chunks)
            if chunk in p.parts:
                raise protocol.ProtocolError(f"step_chunk: chunk {chunk} of step {step} was already received")
            p.parts[chunk] = data
            p.size += len(data)
            if p.size > protocol.MAX_STEP_BYTES:
                del st.pending[key]
                raise protocol.ProtocolError(f"step_chunk: step {step} exceeds {protocol.MAX_STEP_BYTES} bytes")
            if len(p.parts) < chunks:
                return None
            del st.pending[key]
        return b"".join(p.parts[i] for i in range(chunks))

    def on_history(self, msg: Any) -> dict[str, Any]:
        from gradscape.app.api.history import receive_history  # not at the top: app.api's modules import app.server's

        return receive_history(self.state, msg)

    def on_status(self, msg: Any) -> dict[str, Any]:
        payload = protocol.check_envelope(msg, "status")
        stats = protocol.check_status(payload)
        self.state.tracer_stats[msg["run"]] = stats
        self.state.notifier.tracer(msg["run"], "connected", stats)
        return protocol.ack()


class DebugNamespace(ProtocolNamespace):
    """`/debug`: each tracer says `hello` for its run (and gets the run's breakpoints back), then sends
    `paused` when its backward stops at one; the server sends `breakpoints` and `resume` (`protocol.debug`)."""

    events = protocol.DEBUG_EVENTS

    def on_disconnect(self, reason: Any = None) -> None:
        run = self.state.debug.gone(_sid())
        if run is not None:
            self.state.notifier.changed("paused", run)

    def on_hello(self, msg: Any) -> dict[str, Any]:
        protocol.check_envelope(msg, "hello")
        run = msg["run"]
        points = self.state.debug.hello(_sid(), run)
        join_room(run)
        return protocol.debug_hello_ack(points)

    def on_paused(self, msg: Any) -> dict[str, Any]:
        run, pause, thumbs = protocol.check_paused(msg)
        self.state.debug.pause(run, pause, thumbs, _sid())
        self.state.notifier.changed("paused", run)
        return protocol.ack()


class UINamespace(ProtocolNamespace):
    """`/ui`: the browser listens here; it sends nothing but its token (or the page's cookie)."""

    def token(self, auth: Any) -> Any:
        return super().token(auth) or request.cookies.get(TOKEN_COOKIE)

    def on_connect(self, auth: Any = None) -> None:
        super().on_connect(auth)
        # Catch up a page that just (re)connected: steps may have been stored between its layout being
        # served and now, or while it was offline, with no notification it could hear; runs may be paused
        # or have breakpoints. Read like any other notification (`liveSteps` in assets/live.js,
        # `refresh` in assets/debugger.js).
        emit("step", protocol.step_catchup([r["run"] for r in self.state.store.runs()]))
        emit("paused", protocol.paused_catchup(self.state.debug.active_runs()))
