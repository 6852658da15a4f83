"""The monitor's history on the server: the tracers' `history` messages (stored in one transaction
each, then a light `/ui` notification; `receive_history`, used by the `/tracer` namespace) and
`GET /api/runs/<run>/history` (docs/api.md).

    GET /api/runs/<run>/history[?rank=R][&since=S]  → {"run", "rank", "steps": [row, ...]}

Each row is `TraceStore.history`'s (tracer/wire/history.py) as JSON: NaN and infinities are null and
the row's `nonfinite` names the fields that held them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flask import Flask, Response, jsonify, request

from gradscape.app.api.errors import BadParameter, NotFound, check_index, check_run
from gradscape.tracer import protocol
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire import TraceFormatError, unpack
from gradscape.tracer.wire.history import history_from_wire, json_row

if TYPE_CHECKING:
    from gradscape.app.serving.state import ServerState


def receive_history(state: ServerState, msg: Any) -> dict[str, Any]:
    """A tracer's `history` message: checked, stored, announced. Raises ProtocolError naming what was wrong."""
    payload = protocol.check_envelope(msg, "history")
    data = protocol.check_history(payload)
    try:
        batch = history_from_wire(unpack(data))
    except TraceFormatError as exc:
        raise protocol.ProtocolError(f"history: malformed rows: {exc}") from exc
    run = msg["run"]
    if batch["run"] != run:
        raise protocol.ProtocolError(f"history: data is run {batch['run']!r}, the message says run {run!r}")
    if batch["rows"]:
        state.store_history(batch)
    return protocol.history_ack(len(batch["rows"]))


def register_history(server: Flask, store: TraceStore) -> None:
    """The history route."""

    @server.get("/api/runs/<run>/history")
    def api_history(run: str) -> Response:
        check_run(run)
        rank = check_index(request.args["rank"], "rank") if "rank" in request.args else 0
        since = check_index(request.args["since"], "since") if "since" in request.args else None
        if rank and rank not in store.ranks(run) and not store.history(run, rank):
            raise NotFound(f"run {run!r} has no rank {rank}")
        rows = store.history(run, rank, since)
        if not rows and since is None and run not in {r["run"] for r in store.runs()}:
            raise NotFound(f"no run {run!r}")
        if len(request.args.getlist("rank")) > 1:
            raise BadParameter("rank: give it once")
        return jsonify({"run": run, "rank": rank, "steps": [json_row(r) for r in rows]})
