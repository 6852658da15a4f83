"""The JSON API (docs/api.md): the read routes over the trace store (`runs`), the run's history
(`history`), the debugger's routes
(`debugger`), the JSON forms they answer with (`forms`) and their errors, mapped to responses once
(`errors`)."""

from __future__ import annotations

from flask import Flask
from flask_socketio import SocketIO

from gradscape.app.api.debugger import register_debugger
from gradscape.app.api.errors import register_errors
from gradscape.app.api.forms import graph_json, node_json, node_tensor_indices, tensor_json, thumb_json
from gradscape.app.api.history import register_history
from gradscape.app.api.runs import register_runs
from gradscape.app.serving.state import ServerState


def register_api(server: Flask, socketio: SocketIO, state: ServerState) -> None:
    """Every `/api/` route on one server, and the error handling they share."""
    register_errors(server)
    register_runs(server, state.store, state.flags)
    register_history(server, state.store)
    register_debugger(server, socketio, state)


__all__ = ["graph_json", "node_json", "node_tensor_indices", "register_api", "tensor_json", "thumb_json"]
