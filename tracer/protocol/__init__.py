"""The socket protocol, defined once and used by the tracer, the server and the page: every message of
every namespace, its name, its builder and its check. Versioned apart from the code (`PROTOCOL_VERSION`).

Every message the tracer sends is one map, the envelope (`envelope`), around a payload:

    {"v": 1, "type": "step_chunk", "run": "my-run", "seq": 12, "time": 1763750000.5, "payload": {...}}

and is acknowledged (`call`) with `{"ok": true, ...}` (`ack`), or, when anything was wrong, with
`{"ok": false, "error": "<what was wrong>"}` (`refused`), which changes nothing.

    namespace  who                   events                                   module
    /tracer    tracer → server       hello, step_chunk, status, history       `stream`
    /debug     tracer → server       hello, paused                            `debug`, `paused`
               server → tracer       breakpoints, resume                      `debug`
    /ui        server → page         run, step, history, tracer, paused,      `ui`
                                     breakpoints

Each module's docstring lists its events' payloads. The step itself travels in its wire form
(`tracer.wire`), packed, in `step_chunk`s.
"""

from gradscape.tracer.protocol.debug import (
    BREAKPOINT_KINDS,
    DEBUG_EVENTS,
    DEBUG_NAMESPACE,
    RESUME_MODES,
    breakpoints_message,
    check_breakpoint,
    check_resume_mode,
    resume_message,
)
from gradscape.tracer.protocol.debug import hello_ack as debug_hello_ack
from gradscape.tracer.protocol.envelope import (
    ACCEPTED_VERSIONS,
    CHUNK_BYTES,
    MAX_CHUNKS,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_STEP_BYTES,
    PROTOCOL_VERSION,
    ProtocolError,
    ack,
    check_envelope,
    check_name,
    count,
    envelope,
    refused,
)
from gradscape.tracer.protocol.paused import (
    MAX_PAUSED_NODES,
    MAX_PAUSED_THUMB_BYTES,
    MAX_THUMB_ELEMENTS,
    SLOTS,
    Thumbs,
    add_thumbs,
    check_paused,
    check_paused_nodes,
    paused_node,
    paused_payload,
    paused_step,
    paused_tensor,
)
from gradscape.tracer.protocol.stream import (
    STEP_FORMS,
    TRACER_EVENTS,
    TRACER_NAMESPACE,
    check_chunk,
    check_hello,
    check_history,
    check_status,
    chunk_ack,
    hello_ack,
    history_ack,
)
from gradscape.tracer.protocol.ui import (
    UI_EVENTS,
    UI_NAMESPACE,
    changed_note,
    history_note,
    paused_catchup,
    run_note,
    step_catchup,
    step_note,
    tracer_note,
)

__all__ = [
    "ACCEPTED_VERSIONS", "BREAKPOINT_KINDS", "CHUNK_BYTES", "DEBUG_EVENTS", "DEBUG_NAMESPACE", "MAX_CHUNKS",
    "MAX_MESSAGE", "MAX_NAME", "MAX_PAUSED_NODES", "MAX_PAUSED_THUMB_BYTES", "MAX_STEP_BYTES", "MAX_THUMB_ELEMENTS",
    "PROTOCOL_VERSION", "RESUME_MODES", "SLOTS", "STEP_FORMS", "TRACER_EVENTS", "TRACER_NAMESPACE", "UI_EVENTS",
    "UI_NAMESPACE", "ProtocolError", "Thumbs", "ack", "add_thumbs", "breakpoints_message", "changed_note",
    "check_breakpoint", "check_chunk", "check_envelope", "check_hello", "check_history", "check_name", "check_paused",
    "check_paused_nodes", "check_resume_mode", "check_status", "chunk_ack", "count", "debug_hello_ack", "envelope",
    "hello_ack", "history_ack", "history_note", "paused_catchup", "paused_node", "paused_payload", "paused_step",
    "paused_tensor", "refused",
    "resume_message", "run_note", "step_catchup", "step_note", "tracer_note",
]
