"""What every message shares: the envelope, the protocol version, the size limits and the error.

    {"v": 1, "type": "step_chunk", "run": "my-run", "seq": 12, "time": 1763750000.5, "payload": {...}}

`v` is the protocol version, `seq` counts the messages of one connection (0, 1, 2, …), `time` is the
sender's wall clock (seconds). The events of each namespace are in `stream` (`/tracer`), `debug`
(`/debug`, the paused message in `paused`) and `ui` (`/ui`).
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

class ProtocolError(ValueError):
    """A message does not follow the protocol; the text names the field and what was wrong."""


def envelope(type_: str, run: str, seq: int, payload: dict[str, Any]) -> dict[str, Any]:
    """One message: the common fields around `payload` (what the tracer's sockets send)."""
    return {"v": PROTOCOL_VERSION, "type": type_, "run": run, "seq": seq, "time": time.time(), "payload": payload}


def need(d: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """`d[key]`, of type `kind` (a bool is no int here); ProtocolError naming `where.key` otherwise."""
    if key not in d:
        raise ProtocolError(f"{where}: missing field {key!r}")
    v = d[key]
    if isinstance(v, bool) and kind is not bool or not isinstance(v, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ProtocolError(f"{where}.{key}: expected {names}, got {type(v).__name__}")
    return v


def check_name(v: Any, where: str) -> str:
    """A run, module or node name: a string of 1..MAX_NAME characters without control characters."""
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
    t = need(msg, "type", str, expected_type)
    if t != expected_type:
        raise ProtocolError(f"{expected_type}: message type {t!r} sent as event {expected_type!r}")
    check_name(msg.get("run"), f"{expected_type}.run")
    seq = need(msg, "seq", int, expected_type)
    if seq < 0:
        raise ProtocolError(f"{expected_type}.seq: must be >= 0, got {seq}")
    ts = need(msg, "time", (int, float), expected_type)
    if not math.isfinite(ts):
        raise ProtocolError(f"{expected_type}.time: must be a finite number, got {ts!r}")
    return dict(need(msg, "payload", dict, expected_type))


def count(v: Any, where: str) -> int:
    """A non-negative int (a bool is none); ProtocolError naming `where` otherwise."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:60] + "…"
        raise ProtocolError(f"{where}: expected a non-negative int, got {shown}")
    return v


def ack(**fields: Any) -> dict[str, Any]:
    """An accepted message's acknowledgement: `{"ok": true, ...fields}`."""
    return {"ok": True, **fields}


def refused(error: str) -> dict[str, Any]:
    """A refused message's acknowledgement: `{"ok": false, "error": "<what was wrong>"}`."""
    return {"ok": False, "error": error}
