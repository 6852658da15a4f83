"""The JSON API's errors, turned into responses in one place (`register_errors`).

    ApiError            a request the API cannot answer; `status` is the HTTP code
    ├── BadParameter    400: a malformed parameter or body; the text names it
    ├── Forbidden       403: a write from another site's page
    ├── NotFound        404: what was asked for does not exist; the text says what, never where
    ├── NotAllowed      405: a method the route does not take
    └── Conflict        409: the run is not in the state the request needs (not paused)

Every answer under `/api/` is JSON, errors included (`{"error": "..."}`): an unknown path is 404, a wrong
method 405, and a 5xx is a bug, still answered as JSON, without a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException, InternalServerError

from gradscape.tracer.protocol import MAX_NAME, ProtocolError, check_name

log = logging.getLogger(__name__)
MAX_INDEX = (1 << 63) - 1  # SQLite's INTEGER range: a step or node number beyond it cannot exist
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


class ApiError(Exception):
    status = 400


class BadParameter(ApiError, ValueError):
    """A route parameter or body is malformed (answered 400); the text names the parameter."""


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError, LookupError):
    """What a route asked for does not exist (answered 404); the text says what, never where."""

    status = 404


class NotAllowed(ApiError):
    status = 405


class Conflict(ApiError):
    status = 409


def error(message: str, status: int) -> Response:
    resp = jsonify({"error": message})
    resp.status_code = status
    return resp


def check_run(run: str) -> str:
    try:
        return check_name(run, "run")
    except ProtocolError as exc:
        raise BadParameter(str(exc)) from None


def check_index(text: str, what: str) -> int:
    """A step or node number from the path: decimal digits only, 0..2^63-1 (SQLite's range)."""
    if not (0 < len(text) <= 19 and text.isascii() and text.isdigit()):
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise BadParameter(f"{what} must be an integer in 0..{MAX_INDEX}, got {shown!r}")
    value = int(text)
    if value > MAX_INDEX:
        raise BadParameter(f"{what} must be an integer in 0..{MAX_INDEX}, got {text!r}")
    return value


def register_errors(server: Flask) -> None:
    """Every `/api/` error as JSON (keyed on the path, so routes added by any module get it), and the
    catch-all for unknown `/api/` paths."""

    @server.route("/api/", methods=ALL_METHODS)
    @server.route("/api/<path:rest>", methods=ALL_METHODS)
    def api_unknown(rest: str = "") -> Response:
        # Without this, Dash's catch-all page route answers any unknown /api/ path with the page.
        return error(f"no API route {_shown_path()} (see docs/api.md)", 404)

    server.register_error_handler(ApiError, lambda exc: error(str(exc), exc.status))
    server.register_error_handler(HTTPException, _http_error)  # 500 included: Flask's wrapper of any other error


def _shown_path() -> str:
    path = request.path
    return repr(path if len(path) <= MAX_NAME else path[:MAX_NAME] + "…")


def _http_error(exc: HTTPException) -> Any:
    if not request.path.startswith("/api/"):
        return exc
    if isinstance(exc, InternalServerError):
        cause = exc.original_exception
        log.error("gradscape: %s %s failed", request.method, request.path, exc_info=cause)
        return error(f"internal error answering {_shown_path()} ({type(cause).__name__}); the server log has "
                     "details", 500)
    if exc.code == 405:
        return error(f"{request.method} is not allowed on {_shown_path()}", 405)
    return error(f"{exc.name} ({_shown_path()})", exc.code or 400)
