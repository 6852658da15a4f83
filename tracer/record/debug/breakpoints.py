"""Live breakpoints in the backward pass: the tracer side.

NOTE [Breakpoints]
    The server keeps each run's breakpoints (`DebugState`, app/serving/state.py) and pushes the list to that run's
    tracer over a Socket.IO connection of its own, on the `/debug` namespace (`BreakpointLink`, started by the socket
    sink). It is a second connection, not the sink's: the sink's sender thread may be in the middle of a step's binary
    chunks when a node pauses, and the pause must be announced from the engine's thread at once. Everything sent on
    `/debug` is plain JSON, one packet per message, but for the thumbnails of a `paused` message (NOTE [Paused
    heatmaps]), binary attachments.

    Each run has one `Breaker` (`breaker(run)`), cleared when a new link takes it (`Breaker.attach`:
    a second tracer of the run in this process, a notebook cell run again). The recorder's node
    hooks test `breaker.armed`, a plain attribute that is False unless the server has sent at least
    one breakpoint for the run and the link is up: with no breakpoint set there is no round trip,
    lock or wait per node. When armed,
    `Breaker.at_node` matches the node that just ran:

      {"on": "node", "name": "AddmmBackward0"} / {"on": "node", "id": 12}  that node (ids are the
          tracer's, issued in walk order: the same graph gets the same ids every step);
      {"on": "module", "name": "fc2"}  a node attributed to fc2 or a module inside it, or the
          AccumulateGrad of one of its parameters;
      {"on": "nonfinite"}  the first node of the step that sent (or, for AccumulateGrad, received)
          a gradient with a NaN or an Inf; once per step: every node downstream would match too;
      {"on": "norm", "above": x}  the first node of the step that sent a gradient whose L2 norm
          exceeds x; once per step, for the same reason.

    A hit pauses the backward inside the node's hook, after the node's gradients were summarised:
    the recorder's pending summaries are fetched (`Summariser.finalize`, which later steps of the
    same backward tolerate: it only moves results to the host) and the partial backward (every
    node run so far with its gradients' statistics) goes to the server in a `paused` message. The
    hook then waits in 50 ms slices (so Ctrl-C reaches a backward running on the main thread) for
    the server's `resume`: `step` pauses again at the very next node, `continue` at the next hit.
    Nothing the backward computes is touched, so gradients and parameters are bitwise those of a
    run that never paused. If the link drops while paused the hook waits `grace` seconds for it to
    come back, then resumes with one warning, and the run's breakpoints are dropped (they lived on
    the server); a server that comes back pushes its own list.

NOTE [Paused heatmaps]
    The `paused` message also carries the thumbnails the recorder already made for the nodes run so
    far (`TensorTrace.thumb`: block means, at most `thumb`×`thumb`, NOTE [Thumbnail views] in
    tracer/summary/thumbnails.py), so the page can draw their gradients as heatmaps while the backward waits.
    They are bounded: whole nodes, newest first (the paused one first), until `Breaker.thumb_budget`
    bytes (`THUMB_BUDGET`, 4 MiB; each array counted with `THUMB_OVERHEAD` bytes on top) or
    `MAX_THUMBS` arrays would be passed. An older node keeps its statistics and says `"thumbs":
    false`. Each thumbnail is an `encode_array` map (float32, raw little-endian bytes, so NaN and
    ±Inf arrive as they were), which Socket.IO sends as a binary attachment; no pickle. Each node
    also carries its slot labels and arguments (`labels`, `args`: the `StructureCache`'s, as the
    finished step will have them), or None when they cannot be worked out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
from typing import Any

import torch

from gradscape.tracer import protocol
from gradscape.tracer.record.view import StepView
from gradscape.tracer.record.walk import NodeRecord

log = logging.getLogger(__name__)

NAMESPACE = protocol.DEBUG_NAMESPACE
check_breakpoint = protocol.check_breakpoint
DEFAULT_GRACE = 60.0
_WAIT_SLICE = 0.05
THUMB_BUDGET = 4 * 1024 * 1024  # bytes of thumbnails one paused message carries (NOTE [Paused heatmaps])
THUMB_OVERHEAD = 64  # what one array costs on top of its bytes (its map, its binary attachment), for the budget
MAX_THUMBS = 4096  # arrays one paused message carries at most (each travels as an attachment of its own)


class Breaker:
    """One run's breakpoints and pause state in this process. See NOTE [Breakpoints]."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.armed = False  # read by every node hook: True only with breakpoints and a live link
        self.points: list[dict[str, Any]] = []
        self.link: BreakpointLink | None = None
        self.paused = False
        self.pauses = 0  # how many times a backward paused under the current link (tests, bench)
        self.thumb_budget = THUMB_BUDGET  # bytes of thumbnails per paused message (NOTE [Paused heatmaps])
        self._lock = threading.Lock()
        self._resume = threading.Event()
        self._mode = "continue"
        self._stepping = False
        self._fired: set[tuple[str, int]] = set()  # (kind, step) of once-per-step kinds that fired

    # ------------------------------------------------------------------ from the link
    def set_points(self, points: list[dict[str, Any]]) -> None:
        with self._lock:
            self.points = points
            self._update()

    def resume(self, mode: str) -> None:
        self._mode = mode
        self._resume.set()

    def _update(self) -> None:
        link = self.link
        self.armed = bool(self.points or self._stepping) and link is not None and link.connected

    def link_changed(self) -> None:
        with self._lock:
            self._update()

    def attach(self, link: BreakpointLink) -> None:
        """`link` is now the run's: it starts with nothing of an earlier link's (its hello brings the points)."""
        with self._lock:
            self.link = link
            self.points, self.pauses, self._stepping, self._fired = [], 0, False, set()
            self._update()

    # ------------------------------------------------------------------ from the node hooks
    def at_node(self, rec: StepView, node: NodeRecord, grad_inputs: Any, grad_outputs: Any) -> None:
        """Called by the recorder's hooks (when `armed`) after node `node` ran and was
        recorded; pauses here when a breakpoint matches."""
        try:
            hit = self._stepping or self._matches(rec, node, grad_inputs, grad_outputs)
        except Exception as exc:  # never break the user's backward over a breakpoint
            log.warning("gradscape: breakpoint check failed at %s: %s", node.name, exc)
            return
        if hit:
            self._pause(rec, node)

    def _matches(self, rec: StepView, node: NodeRecord, grad_inputs: Any, grad_outputs: Any) -> bool:
        module: Any = False  # computed once, on demand
        for bp in self.points:
            on = bp["on"]
            if on == "node":
                if ("id" in bp and bp["id"] == node.id) or ("name" in bp and bp["name"] == node.name):
                    return True
            elif on == "module":
                if module is False:
                    module = _module_of(rec, node)
                name = bp["name"]
                for m in (module, node.param):
                    if m is not None and (m == name or m.startswith(name + ".")):
                        return True
            elif (on, rec.step) not in self._fired:
                grads = [g for g in (grad_outputs if grad_inputs is None else grad_inputs) if g is not None]
                if on == "nonfinite":
                    if grad_inputs is not None:
                        grads += [g for g in grad_outputs if g is not None]
                    found = any(not bool(torch.isfinite(g).all()) for g in grads if g.is_floating_point())
                else:
                    found = any(float(torch.linalg.vector_norm(g.detach().float())) > bp["above"] for g in grads
                                if g.is_floating_point() or g.is_complex())
                if found:
                    self._fired.add((on, rec.step))
                    return True
        return False

    def _pause(self, rec: Any, node: Any) -> None:
        link = self.link
        if link is None:
            return
        try:
            rec.summ.finalize()  # the statistics and thumbnails of every node run so far, for the page
            nodes = partial_nodes(rec, self.thumb_budget)
            payload = protocol.paused_payload(rec.step, _info(node, nodes), nodes, self.thumb_budget)
        except Exception as exc:  # never break the user's backward over a breakpoint
            log.warning("gradscape: could not pause at %s: %s", node.name, exc, exc_info=True)
            return
        self._resume.clear()
        self.paused = True
        self.pauses += 1
        try:
            answer = link.send("paused", payload, ack=True)
            if isinstance(answer, dict) and answer.get("ok") is False:
                # the server did not take the pause, so nothing there could resume it: go on
                warnings.warn(f"gradscape: the server refused the pause at {node.name}: {answer.get('error')}; "
                              f"the backward goes on", RuntimeWarning, stacklevel=2)
                mode = "continue"
            else:
                mode = self._wait(link)
        finally:
            self.paused = False
        with self._lock:
            self._stepping = mode == "step"
            self._update()

    def _wait(self, link: BreakpointLink) -> str:
        lost_at: float | None = None
        while not self._resume.wait(_WAIT_SLICE):  # short slices: Ctrl-C gets through between them
            if link.connected:
                lost_at = None
                continue
            now = time.monotonic()
            if lost_at is None:
                lost_at = now
            elif now - lost_at >= link.grace:
                warnings.warn(f"gradscape: run {self.run!r} was paused at a breakpoint and the server has been "
                              f"unreachable for {link.grace:g} s; training resumes and the breakpoints are "
                              f"dropped", RuntimeWarning, stacklevel=2)
                with self._lock:
                    self.points = []
                return "continue"
        return self._mode


def _info(node: NodeRecord, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The paused node, as the `paused` message names it (`nodes`: `partial_nodes`)."""
    here = next((n for n in reversed(nodes) if n["id"] == node.id), None)
    return {"id": node.id, "name": node.name, "module": here["module"] if here else None,
            "source": here["source"] if here else None}


def _module_of(rec: StepView, node: NodeRecord) -> str | None:
    if node.kind in ("param", "leaf"):
        return None
    return rec.forward.modules_of([node.seq])[0]  # type: ignore[no-any-return]


def _tensor(t: Any) -> dict[str, Any] | None:
    return None if t is None else protocol.paused_tensor(t.shape, t.dtype, t.stats, t.thumb_view)


def _labels(rec: Any, mods: list[str | None]) -> list[Any] | None:
    """Every walked node's slot labels and arguments (`NodeStatics`, by node id; `mods`: every walked
    node's module), or None when they cannot be worked out mid-backward: the heatmaps then name
    slots by position."""
    try:
        return rec.slot_statics(mods)  # type: ignore[no-any-return]
    except Exception as exc:  # never break the user's backward over a label
        log.info("gradscape: no slot labels for the paused backward: %s", exc)
        return None


def partial_nodes(rec: Any, budget: int = THUMB_BUDGET) -> list[dict[str, Any]]:
    """The nodes a step's backward has run so far, in execution order, with their gradients'
    statistics (the recorder's summaries, fetched) and slot labels; JSON-ready but for the
    thumbnails, and non-finite statistics are None. See NOTE [Paused heatmaps] for the thumbnails
    (`budget`: their bytes, newest nodes first)."""
    recs = rec.recs
    runs = [(recs[rid], recs[rid].runs[k]) for rid, k in rec.execution]
    mods = rec.forward.modules_of([r.seq for r in recs])  # by node id (ids are positions in `recs`)
    statics = _labels(rec, mods)
    out = []
    for pos, (r, run) in enumerate(runs):
        acc, mod = r.kind in ("param", "leaf"), mods[r.id]
        st = statics[r.id] if statics is not None and r.id < len(statics) else None
        out.append(protocol.paused_node(
            id=r.id, name=r.name, kind=r.kind, module=None if acc else mod, param=r.param,
            source=None if acc else rec.forward.source_of(r.seq), order=pos, pass_index=run.pass_index,
            labels=None if st is None else st.labels, args=None if st is None else st.args,
            grad_outputs=[_tensor(t) for t in run.grad_outputs],
            grad_inputs=None if run.grad_inputs is None else [_tensor(t) for t in run.grad_inputs]))
    spent = count = 0
    for pos in range(len(out) - 1, -1, -1):  # newest first, whole nodes, until the budget is spent
        _, run = runs[pos]
        slots = [("grad_outputs", i, t) for i, t in enumerate(run.grad_outputs)]
        slots += [("grad_inputs", j, t) for j, t in enumerate(run.grad_inputs or [])]
        thumbs = [(kind, j, t.thumb) for kind, j, t in slots if t is not None and t.thumb is not None]
        cost = sum(int(a.nbytes) + THUMB_OVERHEAD for _, _, a in thumbs)
        if spent + cost > budget or count + len(thumbs) > MAX_THUMBS:
            break
        spent, count = spent + cost, count + len(thumbs)
        protocol.add_thumbs(out[pos], thumbs)
    return out


_breakers: dict[str, Breaker] = {}
_breakers_lock = threading.Lock()


def breaker(run: str) -> Breaker:
    """The run's `Breaker` in this process (made on first use)."""
    b = _breakers.get(run)
    if b is None:
        with _breakers_lock:
            b = _breakers.setdefault(run, Breaker(run))
    return b


class BreakpointLink:
    """The tracer's `/debug` connection for one run: learns the run's breakpoints, announces pauses
    and hears `resume`. A daemon thread connects with backoff and reconnects; nothing here raises
    into training. `grace`: how long a paused backward waits for a lost server before resuming
    (`GRADSCAPE_BREAK_GRACE` in the environment overrides the default of 60 s)."""

    def __init__(self, url: str, run: str, token: str | None = None, grace: float | None = None,
                 connect_timeout: float = 5.0) -> None:
        env = os.environ.get("GRADSCAPE_BREAK_GRACE")
        self.grace = float(grace if grace is not None else env if env else DEFAULT_GRACE)
        self.url, self.run, self.token, self.connect_timeout = url, run, token, connect_timeout
        self.breaker = breaker(run)
        self.breaker.attach(self)
        self.connected = False
        self._client: Any = None
        self._seq = 0
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gradscape-breakpoints", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        b = self.breaker
        if b.link is self:
            b.link = None
            b.link_changed()
            b.resume("continue")  # a backward paused on another thread must not outlive the link
        client, self._client = self._client, None
        if client is not None:
            threading.Thread(target=_quiet_disconnect, args=(client,), name="gradscape-bp-disconnect",
                             daemon=True).start()

    def send(self, event: str, payload: dict[str, Any], ack: bool = False) -> Any:
        """Emit one message on `/debug`; lost silently when the link is down. With `ack`, wait (up to
        `connect_timeout`) for the server's answer and return it (None when there is none)."""
        client = self._client
        if client is None or not self.connected:
            return None
        with self._send_lock:
            msg = protocol.envelope(event, self.run, self._seq, payload)
            self._seq += 1
            try:
                if ack:
                    return client.call(event, msg, namespace=NAMESPACE, timeout=self.connect_timeout)
                client.emit(event, msg, namespace=NAMESPACE)
            except Exception as exc:
                log.info("gradscape: could not send %s: %s", event, exc)
        return None

    def _loop(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            if self._client is None:
                if self._connect():
                    backoff = 0.2
                else:
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
            self._stop.wait(0.2)

    def _connect(self) -> bool:
        import socketio

        client = socketio.Client(reconnection=False, logger=False, engineio_logger=False)
        b = self.breaker

        @client.on("breakpoints", namespace=NAMESPACE)  # type: ignore[untyped-decorator]
        def _points(msg: Any) -> None:
            self._take_points(msg)

        @client.on("resume", namespace=NAMESPACE)  # type: ignore[untyped-decorator]
        def _resume(msg: Any) -> None:
            mode = msg.get("mode") if isinstance(msg, dict) else None
            if mode in ("step", "continue"):
                b.resume(mode)

        @client.on("disconnect", namespace=NAMESPACE)  # type: ignore[untyped-decorator]
        def _gone(*_: Any) -> None:
            if self._client is client:
                self.connected = False
                self._client = None
                b.link_changed()

        try:
            client.connect(self.url, namespaces=[NAMESPACE], auth={"token": self.token} if self.token else None,
                           transports=["websocket"], wait_timeout=self.connect_timeout)
            self._client, self._seq = client, 0
            ack = client.call("hello", protocol.envelope("hello", self.run, 0, {"pid": os.getpid()}),
                              namespace=NAMESPACE, timeout=self.connect_timeout)
            self._seq = 1
            if not isinstance(ack, dict) or not ack.get("ok"):
                raise ConnectionError(ack.get("error") if isinstance(ack, dict) else repr(ack))
            self.connected = True
            self._take_points(ack)
            return True
        except Exception as exc:
            log.info("gradscape: breakpoint link to %s: %s", self.url, exc)
            self._client = None
            self.connected = False
            b.link_changed()
            _quiet_disconnect(client)
            return False

    def _take_points(self, msg: Any) -> None:
        raw = msg.get("breakpoints") if isinstance(msg, dict) else None
        points = []
        for bp in raw if isinstance(raw, list) else []:
            try:
                points.append(check_breakpoint(bp))
            except ValueError as exc:
                log.warning("gradscape: ignoring a breakpoint from the server: %s", exc)
        self.breaker.set_points(points)


def _quiet_disconnect(client: Any) -> None:
    with contextlib.suppress(Exception):
        client.disconnect()
