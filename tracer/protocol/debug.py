"""`/debug`: live breakpoints (NOTE [Breakpoints] in tracer/record/debug/breakpoints.py), on the tracer's second
connection. The tracer sends, with `call`:

    hello    payload {"pid": 4242}              ack {"ok": true, "breakpoints": [<breakpoint>, ...]}
    paused   the partial backward (`paused`)     ack {"ok": true}

and the server sends, to the run's tracers:

    breakpoints  {"breakpoints": [<breakpoint>, ...]}    the run's whole list, after every change
    resume       {"mode": "step"|"continue"}             to the paused tracer

A breakpoint, in the normal form `check_breakpoint` gives (the JSON API's body takes the same):
`{"on": "node", "name": "AddmmBackward0"}`, `{"on": "node", "id": 12}`, `{"on": "module", "name": "fc2"}`,
`{"on": "nonfinite"}`, `{"on": "norm", "above": 1000.0}`.
"""

from __future__ import annotations

import math
from typing import Any

from gradscape.tracer.protocol.envelope import ack, check_name

DEBUG_NAMESPACE = "/debug"
DEBUG_EVENTS = ("hello", "paused")  # what the tracer sends; the server sends "breakpoints" and "resume"
BREAKPOINT_KINDS = ("node", "module", "nonfinite", "norm")
RESUME_MODES = ("step", "continue")


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
        return {"on": "node", "name": _name(bp["name"])}
    if on == "module":
        if "name" not in bp:
            raise ValueError('a module breakpoint needs "name" (the qualified module name, like "fc2")')
        return {"on": "module", "name": _name(bp["name"])}
    if on == "norm":
        if "above" not in bp:
            raise ValueError('a norm breakpoint needs "above" (a number)')
        above = bp["above"]
        if isinstance(above, bool) or not isinstance(above, (int, float)) or not math.isfinite(above):
            raise ValueError(f'"above" must be a finite number, got {above!r}')
        return {"on": "norm", "above": float(above)}
    return {"on": "nonfinite"}


def _name(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f'"name" must be a string, got {type(v).__name__}')
    return check_name(v, '"name"')  # ProtocolError is a ValueError


def hello_ack(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The server's answer to a tracer's `hello` on `/debug`: the run's breakpoints."""
    return ack(breakpoints=points)


def breakpoints_message(points: list[dict[str, Any]]) -> dict[str, Any]:
    return {"breakpoints": points}


def resume_message(mode: str) -> dict[str, Any]:
    """`resume` to a paused tracer: `step` pauses again at the very next node, `continue` at the next hit."""
    return {"mode": check_resume_mode(mode)}


def check_resume_mode(mode: Any) -> str:
    if mode not in RESUME_MODES:
        raise ValueError(f'"mode" must be "step" or "continue", got {mode!r}')
    return str(mode)
