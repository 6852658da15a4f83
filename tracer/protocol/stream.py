"""`/tracer`: the step stream. The socket sink sends, with `call` (acknowledged):

    hello       payload {"client": "gradscape-tracer/0.1.0", "accepts": [1], "pid": 4242, "host": "gpu-3"}
                ack     {"ok": true, "protocol": 1, "max_message": 16777216, "chunk": 4194304,
                         "forms": ["maps", "columns"]}
    step_chunk  payload {"step": 7, "chunk": 0, "chunks": 3, "data": <bytes>}
                `data` of all chunks, concatenated, is the msgpack-packed wire form of one StepTrace
                (`tracer.wire`), or, to a server whose hello said "columns", a natively recorded
                step's column document with its tensors' arrays (`tracer.wire.column_check`); the
                server validates and stores it in one transaction after the last chunk, so a step
                is visible whole or not at all.
                ack     {"ok": true, "step": 7, "chunk": 2, "stored": true}
    status      payload {"sent": 10, "spilled": 2, "dropped": 0}      (tracer counters, for the UI)
                ack     {"ok": true}
    history     payload {"data": <bytes>}: msgpack of a batch of the monitor's history rows
                (`tracer.wire.history`), at most CHUNK_BYTES; stored in one transaction
                ack     {"ok": true, "stored": 64}
"""

from __future__ import annotations

from typing import Any

from gradscape.tracer.protocol.envelope import (
    ACCEPTED_VERSIONS,
    CHUNK_BYTES,
    MAX_CHUNKS,
    MAX_MESSAGE,
    PROTOCOL_VERSION,
    ProtocolError,
    ack,
    need,
)

TRACER_NAMESPACE = "/tracer"
TRACER_EVENTS = ("hello", "step_chunk", "status", "history")


def check_hello(payload: dict[str, Any]) -> list[int]:
    accepts = need(payload, "accepts", list, "hello.payload")
    if not all(isinstance(a, int) and not isinstance(a, bool) for a in accepts):
        raise ProtocolError("hello.payload.accepts: expected a list of ints")
    if not set(accepts) & set(ACCEPTED_VERSIONS):
        raise ProtocolError(f"hello: the tracer speaks protocol {accepts}, this server accepts "
                            f"{list(ACCEPTED_VERSIONS)}; upgrade the older side")
    return accepts


# how a step's data may be sent: an earlier release's maps (NOTE [Maps of earlier releases] in
# tracer/wire/earlier/__init__.py), or NOTE [Column document]'s
STEP_FORMS = ("maps", "columns")


def hello_ack() -> dict[str, Any]:
    """The server's answer to a tracer's `hello`: the version it speaks, the sizes it takes and the forms of
    a step it reads (a tracer of this release sends nothing to a server that does not say "columns": NOTE
    [Socket sink])."""
    return ack(protocol=PROTOCOL_VERSION, max_message=MAX_MESSAGE, chunk=CHUNK_BYTES, forms=list(STEP_FORMS))


def check_chunk(payload: dict[str, Any]) -> tuple[int, int, int, bytes]:
    step = need(payload, "step", int, "step_chunk.payload")
    chunk = need(payload, "chunk", int, "step_chunk.payload")
    chunks = need(payload, "chunks", int, "step_chunk.payload")
    data = need(payload, "data", (bytes, bytearray), "step_chunk.payload")
    if step < 0:
        raise ProtocolError(f"step_chunk.payload.step: must be >= 0, got {step}")
    if not 1 <= chunks <= MAX_CHUNKS:
        raise ProtocolError(f"step_chunk.payload.chunks: must be 1..{MAX_CHUNKS}, got {chunks}")
    if not 0 <= chunk < chunks:
        raise ProtocolError(f"step_chunk.payload.chunk: must be 0..{chunks - 1}, got {chunk}")
    if len(data) > CHUNK_BYTES:
        raise ProtocolError(f"step_chunk.payload.data: {len(data)} bytes, more than {CHUNK_BYTES} per chunk")
    return step, chunk, chunks, bytes(data)


def chunk_ack(step: int, chunk: int, stored: bool) -> dict[str, Any]:
    """The answer to one `step_chunk`: `stored` once the last chunk made the step whole and it was written."""
    return ack(step=step, chunk=chunk, stored=stored)


def check_history(payload: dict[str, Any]) -> bytes:
    data = need(payload, "data", (bytes, bytearray), "history.payload")
    if len(data) > CHUNK_BYTES:
        raise ProtocolError(f"history.payload.data: {len(data)} bytes, more than {CHUNK_BYTES}")
    return bytes(data)


def history_ack(stored: int) -> dict[str, Any]:
    """The answer to one `history` batch: how many rows were stored."""
    return ack(stored=stored)


def check_status(payload: dict[str, Any]) -> dict[str, int]:
    out = {}
    for k in ("sent", "spilled", "dropped"):
        v = need(payload, k, int, "status.payload")
        if v < 0:
            raise ProtocolError(f"status.payload.{k}: must be >= 0, got {v}")
        out[k] = v
    return out
