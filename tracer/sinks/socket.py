"""The live sink: streams steps to a gradscape server, and never disturbs training.

NOTE [Socket sink]
    `write()` runs in the training loop and only appends the finished `StepTrace` to a queue
    bounded in bytes: no encoding, no I/O, no lock held for long. A daemon sender thread is the only
    thread that touches the Socket.IO client (binary emits from several threads at once can
    interleave their frames): it connects with backoff, says hello (a server of an earlier release, whose
    hello names no "columns" form, is warned of once and taken as unreachable), encodes each step as its
    column document (msgpack: NOTE [Column document] in tracer/wire/columns.py), splits it
    into chunks of `protocol.CHUNK_BYTES` and sends them with acknowledged calls. A step the server
    cannot take (down, too slow, refused) goes to a second queue drained by a spill thread into a
    local SQLite trace file (`gradscape serve --store <spill>` shows it later). When both queues
    are full the step is dropped. Every outcome is counted in `stats`; the first problem warns
    once, never raises. `close(timeout)` flushes what it can in time and spills the rest.

NOTE [Sink threads]
    The two threads start with the first step written, not before, and end when the sink is
    closed (`Tracer.close()`), when the sink is garbage-collected with its Tracer (a
    `weakref.finalize` flushes and closes it on a short-lived thread of its own, so no training loop
    waits), and at interpreter exit (queued steps are flushed or spilled, then the threads end). The
    threads hold the sink's state (`_Sender`), never the `SocketSink` handle that the Tracer holds.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import threading
import time
import warnings
import weakref
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from gradscape.tracer import protocol
from gradscape.tracer._model import StepTrace
from gradscape.tracer.collector import collector_paused
from gradscape.tracer.record.debug.breakpoints import BreakpointLink
from gradscape.tracer.sinks.paths import spill_path
from gradscape.tracer.sinks.queue import ByteQueue, Queued, estimate_bytes
from gradscape.tracer.wire import TraceFormatError, pack
from gradscape.tracer.wire.column_write import step_message
from gradscape.tracer.wire.history import WireHistory, history_parts

log = logging.getLogger(__name__)


class _Sender:
    """The socket sink's state and its two threads; `SocketSink` is the handle the Tracer holds.
    Nothing here refers back to that handle, so dropping it (NOTE [Sink threads]) frees it."""

    def __init__(self, url: str, run: str, *, token: str | None = None, spill: str | None = None,
                 queue_bytes: int = 512 << 20, spill_bytes: int = 1 << 30, connect_timeout: float = 5.0,
                 call_timeout: float = 60.0, break_grace: float | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"sink {url!r}: expected http://host:port")
        self.token = token or parse_qs(parts.query).get("token", [None])[0] or os.environ.get("GRADSCAPE_TOKEN")
        self.url = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        self.run = run
        self.spill_path = spill or spill_path(run)  # the per-user data directory (tracer/sinks/paths.py)
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self.stats: dict[str, int] = {"sent": 0, "spilled": 0, "dropped": 0}
        self.acked: list[int] = []  # steps the server confirmed stored
        self.max_write_ms = 0.0
        self._net = ByteQueue(queue_bytes)
        self._spill = ByteQueue(spill_bytes)
        self._stop = threading.Event()
        self._warned = False
        self._client: Any = None
        self._seq = 0
        self._next_try = 0.0
        self._backoff = 0.2
        self._too_old = False  # the server's hello said it reads no column steps (warned once)
        self._busy = threading.Event()
        self._file: Any = None
        self._sender = threading.Thread(target=self._send_loop, name="gradscape-sender", daemon=True)
        self._spiller = threading.Thread(target=self._spill_loop, name="gradscape-spill", daemon=True)
        self._started = False
        self._closed = False
        self._life = threading.Lock()  # start and close, each once, never at the same time
        # breakpoints: the run's /debug link (NOTE [Breakpoints] in tracer/record/debug/breakpoints.py). Unlike the
        # sender it starts with the sink: a breakpoint set before the first step must pause its backward.
        self._breakpoints = BreakpointLink(self.url, run, token=self.token, grace=break_grace)

    def _start(self) -> None:
        with self._life:
            if self._started or self._closed:
                return
            self._started = True
            _live.add(self)
            self._sender.start()
            self._spiller.start()

    # ------------------------------------------------------------------ training-loop side
    def write(self, st: StepTrace) -> None:
        t0 = time.perf_counter()
        size = estimate_bytes(st)
        if not self._net.offer(st, size):
            self._to_spill(st, size, "the send queue is full")
        self.max_write_ms = max(self.max_write_ms, (time.perf_counter() - t0) * 1e3)  # queueing, not the start
        if not self._started:  # after the step is queued: the new threads' imports do not slow its queueing
            self._start()

    def write_history(self, batch: WireHistory) -> None:
        """A batch of the monitor's history rows (`tracer.wire.history`): queued like a step, sent as
        `history` messages, spilled to the same file when the server cannot take it."""
        if not self._started:
            self._start()
        if not self._net.offer(batch, 256 + 16 * len(batch["rows"]) * (4 + len(batch["params"]))):
            self._to_spill(batch, 0, "the send queue is full")

    def close(self, timeout: float = 10.0) -> None:
        with self._life:
            if self._closed:
                return
            self._closed = True
            self._breakpoints.close()  # breakpoints (NOTE [Breakpoints])
            if self._started:
                self._close(timeout)
            _live.discard(self)

    def _close(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._net.wait_empty(deadline)
        while self._busy.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stop.set()
        for st in self._net.drain():  # not sent in time: keep them on disk
            self._to_spill(st, 0, "the server did not take them before close()", force=True)
        self._spill.wait_empty(deadline + 5.0)
        self._sender.join(max(0.1, deadline - time.monotonic()))
        self._spiller.join(5.0)
        for st in self._spill.drain():
            self._write_spill(st)
        if self._file is not None:
            self._file.close()
        client, self._client = self._client, None
        if client is not None:  # python-socketio's disconnect waits ~3 s for its threads: not our caller's problem
            threading.Thread(target=_quiet_disconnect, args=(client,), name="gradscape-disconnect", daemon=True).start()

    # ------------------------------------------------------------------ shared
    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"gradscape: steps of run {self.run!r} go to {self.spill_path} ({why}); training is "
                          f"not affected. Counts: tr.stats.", RuntimeWarning, stacklevel=2)

    def _to_spill(self, st: Queued, size: int, why: str, force: bool = False) -> None:
        if self._spill.offer(st, size, force=force):
            self._warn(why)
        else:
            self.stats["dropped"] += 1
            self._warn("both the send queue and the spill queue are full; steps are dropped")

    # ------------------------------------------------------------------ spill thread
    def _spill_loop(self) -> None:
        while not self._stop.is_set() or self._spill.items:
            st = self._spill.take(0.2)
            if st is not None:
                self._write_spill(st)

    def _write_spill(self, st: Queued) -> None:
        try:
            if self._file is None:
                from gradscape.tracer.store import TraceStore

                self._file = TraceStore(self.spill_path)
            if isinstance(st, dict):  # a batch of history rows (the monitor)
                self._file.write_history(st)
                return
            self._file.write_step(st)
            self.stats["spilled"] += 1
        except Exception as exc:
            self.stats["dropped"] += 1
            log.warning("gradscape: could not spill %s to %s: %s", "history" if isinstance(st, dict) else
                        f"step {st.step}", self.spill_path, exc)

    # ------------------------------------------------------------------ sender thread
    def _send_loop(self) -> None:
        while not self._stop.is_set():
            st = self._net.take(0.2)
            if st is None:
                if self._client is None and time.monotonic() >= self._next_try:
                    self._connect()
                continue
            self._busy.set()
            try:
                self._deliver(st)
            finally:
                self._busy.clear()

    def _deliver(self, st: Queued) -> None:
        if self._client is None and (time.monotonic() < self._next_try or not self._connect()):
            why = "the server is of an earlier release" if self._too_old else "the server is unreachable"
            self._to_spill(st, 0, why, force=True)
            return
        if isinstance(st, dict):  # a batch of history rows (the monitor)
            return self._deliver_history(st)
        try:
            with collector_paused():  # the wire form is let go inside (NOTE [Collector paused])
                data = pack(step_message(st))
        except TraceFormatError as exc:  # a step built by hand that no file or server can hold
            log.warning("gradscape: step %s is dropped: %s", st.step, exc)
            self.stats["dropped"] += 1
            return
        try:
            chunks = [data[i:i + protocol.CHUNK_BYTES] for i in range(0, len(data), protocol.CHUNK_BYTES)] or [b""]
            ack: Any = None
            for k, part in enumerate(chunks):
                ack = self._call("step_chunk", {"step": st.step, "chunk": k, "chunks": len(chunks), "data": part})
                if not isinstance(ack, dict) or not ack.get("ok"):
                    raise _Refused(ack.get("error") if isinstance(ack, dict) else repr(ack))
            self.stats["sent"] += 1
            self.acked.append(st.step)
            if self.stats["sent"] % 10 == 1 or self.stats["spilled"] or self.stats["dropped"]:
                self._call("status", dict(self.stats))
        except _Refused as exc:
            log.warning("gradscape: the server refused step %s: %s", st.step, exc)
            self._to_spill(st, 0, f"the server refused a step: {exc}", force=True)
        except Exception as exc:  # connection lost mid-step: the server stored nothing of it
            log.info("gradscape: lost the server while sending step %s: %s", st.step, exc)
            self._drop_client()
            self._to_spill(st, 0, "the connection to the server was lost", force=True)

    def _deliver_history(self, batch: WireHistory) -> None:
        try:
            for part in history_parts(batch):
                ack = self._call("history", {"data": part})
                if not isinstance(ack, dict) or not ack.get("ok"):
                    raise _Refused(ack.get("error") if isinstance(ack, dict) else repr(ack))
        except _Refused as exc:
            log.warning("gradscape: the server refused history rows: %s", exc)
            self._to_spill(batch, 0, f"the server refused history rows: {exc}", force=True)
        except Exception as exc:
            log.info("gradscape: lost the server while sending history rows: %s", exc)
            self._drop_client()
            self._to_spill(batch, 0, "the connection to the server was lost", force=True)

    def _call(self, event: str, payload: dict[str, Any]) -> Any:
        """An acknowledged emit that gives up as soon as the connection is known to be gone (the
        client's own `call` would wait out its whole timeout after the server died)."""
        msg = protocol.envelope(event, self.run, self._seq, payload)
        self._seq += 1
        client = self._client
        done = threading.Event()
        box: list[Any] = []

        def on_ack(*args: Any) -> None:
            box.append(args[0] if args else None)
            done.set()

        client.emit(event, msg, namespace="/tracer", callback=on_ack)
        deadline = time.monotonic() + self.call_timeout
        while not done.wait(0.05):
            if not client.connected or time.monotonic() > deadline:
                raise ConnectionError(f"no acknowledgement for {event} (connection lost or timed out)")
        return box[0]

    def _connect(self) -> bool:
        import socketio

        client = socketio.Client(reconnection=False, logger=False, engineio_logger=False)
        try:
            client.connect(self.url, namespaces=["/tracer"], auth={"token": self.token} if self.token else None,
                           transports=["websocket"], wait_timeout=self.connect_timeout)
            self._client, self._seq = client, 0
            ack = self._call("hello", {"client": "gradscape-tracer/0.1.0", "accepts": list(protocol.ACCEPTED_VERSIONS),
                                       "pid": os.getpid(), "host": socket.gethostname()})
            if not isinstance(ack, dict) or not ack.get("ok"):
                raise _Refused(ack.get("error") if isinstance(ack, dict) else repr(ack))
            if "columns" not in (ack.get("forms") or ()):
                raise _TooOld(f"the server at {self.url} is of an earlier release, which reads no step sent as "
                              f"columns; run this release's `gradscape serve` (steps are kept in the spill file)")
            self._backoff = 0.2
            return True
        except _TooOld as exc:
            if not self._too_old:
                self._too_old = True
                log.warning("gradscape: %s", exc)
            self._drop_client(client)
            self._next_try = time.monotonic() + 2.0
            return False
        except Exception as exc:
            log.info("gradscape: cannot reach %s: %s", self.url, exc)
            self._drop_client(client)
            self._next_try = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, 2.0)
            return False

    def _drop_client(self, client: Any = None) -> None:
        c = client or self._client
        self._client = None
        if c is not None:
            with contextlib.suppress(Exception):
                c.disconnect()


class SocketSink:
    """`Tracer(sink="http://127.0.0.1:8050")`: streams steps to a gradscape server. See NOTE [Socket
    sink] and NOTE [Sink threads]. Arguments: those of the server connection and the queues' bounds."""

    def __init__(self, url: str, run: str, **options: Any) -> None:
        self._core = core = _Sender(url, run, **options)
        self.stats = core.stats  # the same dict, counted by the threads
        # on garbage collection: flush and stop in the background (the training loop never waits)
        self._finalizer = weakref.finalize(self, _close_in_background, core)
        self._finalizer.atexit = False  # at exit `_close_all` flushes every live sink, in order

    def write(self, st: StepTrace) -> None:
        self._core.write(st)

    def write_history(self, batch: WireHistory) -> None:
        self._core.write_history(batch)

    def close(self, timeout: float = 10.0) -> None:
        self._finalizer.detach()
        self._core.close(timeout)

    @property
    def acked(self) -> list[int]:
        """Steps the server confirmed stored."""
        return self._core.acked

    @property
    def max_write_ms(self) -> float:
        return self._core.max_write_ms

    @property
    def spill_path(self) -> str:
        return self._core.spill_path

    @property
    def url(self) -> str:
        return self._core.url

    @property
    def run(self) -> str:
        return self._core.run

    @property
    def _net(self) -> ByteQueue:
        return self._core._net

    def threads(self) -> list[threading.Thread]:
        """The sink's threads that are running (none before the first step, none once closed)."""
        return [t for t in (self._core._sender, self._core._spiller) if t.is_alive()]


# senders whose threads run; at exit each is flushed and closed (the threads are daemons)
_live: set[_Sender] = set()


def _close_in_background(core: _Sender) -> None:
    if core._closed:
        return
    if core._started:
        threading.Thread(target=core.close, name="gradscape-close", daemon=True).start()
    else:  # only the breakpoint link runs: closing it does not wait
        core.close(0.0)


@atexit.register
def _close_all() -> None:
    for core in list(_live):
        with contextlib.suppress(Exception):
            core.close(5.0)


class _TooOld(Exception):
    """The server is of a release that reads no column steps (NOTE [Column document])."""


class _Refused(Exception):
    pass


def _quiet_disconnect(client: Any) -> None:
    with contextlib.suppress(Exception):
        client.disconnect()
