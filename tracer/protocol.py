"""The tracer ↔ server protocol: one module, used by both sides. Versioned apart from the code.

Every message, both ways, is one map (one Socket.IO event argument):

    {"v": 1, "type": "step_chunk", "run": "my-run", "seq": 12, "time": 1763750000.5, "payload": {...}}

`v` is the protocol version, `seq` counts the messages of one connection (0, 1, 2, …), `time` is the
sender's wall clock (seconds). Events on the `/tracer` namespace, sent with `call` (acknowledged):

    hello       payload {"client": "gradscape-tracer/0.1.0", "accepts": [1], "pid": 4242, "host": "gpu-3"}
                ack     {"ok": true, "protocol": 1, "max_message": 16777216, "chunk": 4194304}
    step_chunk  payload {"step": 7, "chunk": 0, "chunks": 3, "data": <bytes>}
                `data` of all chunks, concatenated, is the msgpack-packed wire form of one StepTrace
                (`tracer.wire`); the server validates and stores it in one transaction after the
                last chunk, so a step is visible whole or not at all.
                ack     {"ok": true, "step": 7, "chunk": 2, "stored": true}
    status      payload {"sent": 10, "spilled": 2, "dropped": 0}      (tracer counters, for the UI)
                ack     {"ok": true}
    history     payload {"data": <bytes>}: msgpack of a batch of the monitor's history rows
                (`tracer.history_wire`), at most CHUNK_BYTES; stored in one transaction
                ack     {"ok": true, "stored": 64}

Any failure is acknowledged as `{"ok": false, "error": "<what was wrong>"}` and changes nothing.
The server pushes light notifications on `/ui` (never data: the page reads the store):

    run     payload {"run": "my-run"}
    step    payload {"run": "my-run", "step": 7}
    history payload {"run": "my-run", "step": 812}   (the run's history reaches step 812)
    tracer  payload {"run": "my-run", "state": "connected"|"gone", "sent": 10, "spilled": 2, "dropped": 0}
"""

from __future__ import annotations

import math
import time
from typing import Any

PROTOCOL_VERSION = 1
ACCEPTED_VERSIONS = (1,)
MAX_MESSAGE = 16 * 1024 * 1024  # the server's max_http_buffer_size; nothing bigger is ever sent
CHUNK_BYTES = 4 * 1024 * 1024  # step data per message, well under MAX_MESSAGE
MAX_STEP_BYTES = 1024 * 1024 * 1024  # a reassembled step larger than this is refused
MAX_CHUNKS = MAX_STEP_BYTES // CHUNK_BYTES + 1
MAX_NAME = 200

TRACER_EVENTS = ("hello", "step_chunk", "status", "history")


class ProtocolError(ValueError):
    """A message does not follow the protocol; the text names the field and what was wrong."""


def envelope(type_: str, run: str, seq: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "type": type_, "run": run, "seq": seq, "time": time.time(), "payload": payload}


def _need(d: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise ProtocolError(f"{where}: missing field {key!r}")
    v = d[key]
    if isinstance(v, bool) and kind is not bool or not isinstance(v, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ProtocolError(f"{where}.{key}: expected {names}, got {type(v).__name__}")
    return v


def check_name(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise ProtocolError(f"{where}: expected a string, got {type(v).__name__}")
    if not v or len(v) > MAX_NAME:
        raise ProtocolError(f"{where}: must be 1..{MAX_NAME} characters, got {len(v)}")
    if any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for c in v):
        raise ProtocolError(f"{where}: control characters or unpaired surrogates in {v!r}")
    return v


def check_envelope(msg: Any, expected_type: str) -> dict[str, Any]:
    """Validate the common fields; returns the payload. Raises ProtocolError naming the problem."""
    if not isinstance(msg, dict):
        raise ProtocolError(f"{expected_type}: expected one map (the message), got {type(msg).__name__}")
    v = msg.get("v")
    if v not in ACCEPTED_VERSIONS:
        raise ProtocolError(f"{expected_type}: protocol version {v!r} is not accepted; this server accepts "
                            f"{list(ACCEPTED_VERSIONS)}")
    t = _need(msg, "type", str, expected_type)
    if t != expected_type:
        raise ProtocolError(f"{expected_type}: message type {t!r} sent as event {expected_type!r}")
    check_name(msg.get("run"), f"{expected_type}.run")
    seq = _need(msg, "seq", int, expected_type)
    if seq < 0:
        raise ProtocolError(f"{expected_type}.seq: must be >= 0, got {seq}")
    ts = _need(msg, "time", (int, float), expected_type)
    if not math.isfinite(ts):
        raise ProtocolError(f"{expected_type}.time: must be a finite number, got {ts!r}")
    return dict(_need(msg, "payload", dict, expected_type))


def check_hello(payload: dict[str, Any]) -> list[int]:
    accepts = _need(payload, "accepts", list, "hello.payload")
    if not all(isinstance(a, int) and not isinstance(a, bool) for a in accepts):
        raise ProtocolError("hello.payload.accepts: expected a list of ints")
    if not set(accepts) & set(ACCEPTED_VERSIONS):
        raise ProtocolError(f"hello: the tracer speaks protocol {accepts}, this server accepts "
                            f"{list(ACCEPTED_VERSIONS)}; upgrade the older side")
    return accepts


def check_chunk(payload: dict[str, Any]) -> tuple[int, int, int, bytes]:
    step = _need(payload, "step", int, "step_chunk.payload")
    chunk = _need(payload, "chunk", int, "step_chunk.payload")
    chunks = _need(payload, "chunks", int, "step_chunk.payload")
    data = _need(payload, "data", (bytes, bytearray), "step_chunk.payload")
    if step < 0:
        raise ProtocolError(f"step_chunk.payload.step: must be >= 0, got {step}")
    if not 1 <= chunks <= MAX_CHUNKS:
        raise ProtocolError(f"step_chunk.payload.chunks: must be 1..{MAX_CHUNKS}, got {chunks}")
    if not 0 <= chunk < chunks:
        raise ProtocolError(f"step_chunk.payload.chunk: must be 0..{chunks - 1}, got {chunk}")
    if len(data) > CHUNK_BYTES:
        raise ProtocolError(f"step_chunk.payload.data: {len(data)} bytes, more than {CHUNK_BYTES} per chunk")
    return step, chunk, chunks, bytes(data)


def check_history(payload: dict[str, Any]) -> bytes:
    data = _need(payload, "data", (bytes, bytearray), "history.payload")
    if len(data) > CHUNK_BYTES:
        raise ProtocolError(f"history.payload.data: {len(data)} bytes, more than {CHUNK_BYTES}")
    return bytes(data)


def check_status(payload: dict[str, Any]) -> dict[str, int]:
    out = {}
    for k in ("sent", "spilled", "dropped"):
        v = _need(payload, k, int, "status.payload")
        if v < 0:
            raise ProtocolError(f"status.payload.{k}: must be >= 0, got {v}")
        out[k] = v
    return out


# ---------------------------------------------------------------------- breakpoints (/debug)
# The tracers' second connection, for live breakpoints (NOTE [Breakpoints] in tracer/_breakpoints.py):
# the server pushes each run's breakpoints there, in the form `check_breakpoint` gives them.
DEBUG_NAMESPACE = "/debug"
BREAKPOINT_KINDS = ("node", "module", "nonfinite", "norm")


def check_breakpoint(bp: Any) -> dict[str, Any]:
    """Validate one breakpoint (the JSON API's body, or an item of the list the server pushes);
    returns its normal form. Raises `ValueError` naming what was wrong."""
    if not isinstance(bp, dict):
        raise ValueError(f"a breakpoint is a JSON object, got {type(bp).__name__}")
    on = bp.get("on")
    if on not in BREAKPOINT_KINDS:
        raise ValueError(f'"on" must be one of {list(BREAKPOINT_KINDS)}, got {on!r}')
    if on == "node":
        has_name, has_id = "name" in bp, "id" in bp
        if has_name == has_id:
            raise ValueError('a node breakpoint needs exactly one of "name" (like "AddmmBackward0") or "id"')
        if has_id:
            nid = bp["id"]
            if isinstance(nid, bool) or not isinstance(nid, int) or nid < 0:
                raise ValueError(f'"id" must be a non-negative integer, got {nid!r}')
            return {"on": "node", "id": nid}
        return {"on": "node", "name": check_name(bp["name"], '"name"') if isinstance(bp["name"], str)
                else _bad_name(bp["name"])}
    if on == "module":
        if "name" not in bp:
            raise ValueError('a module breakpoint needs "name" (the qualified module name, like "fc2")')
        return {"on": "module", "name": check_name(bp["name"], '"name"') if isinstance(bp["name"], str)
                else _bad_name(bp["name"])}
    if on == "norm":
        if "above" not in bp:
            raise ValueError('a norm breakpoint needs "above" (a number)')
        above = bp["above"]
        if isinstance(above, bool) or not isinstance(above, (int, float)) or not math.isfinite(above):
            raise ValueError(f'"above" must be a finite number, got {above!r}')
        return {"on": "norm", "above": float(above)}
    return {"on": "nonfinite"}


def _bad_name(v: Any) -> str:
    raise ValueError(f'"name" must be a string, got {type(v).__name__}')
