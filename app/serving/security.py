"""Who may talk to the server (docs/web-stack.md): bound to loopback by default; the Host header is checked on every
request unless bound to all interfaces (the Socket.IO origin check alone lets DNS rebinding through); a token is
required when bound anywhere else (generated if not given) and then checked on the socket connect (`namespaces`), the
JSON API and the page (a `?token=` visit sets a cookie); writes from another site's page are refused
(`foreign_origin`)."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, request

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
TOKEN_COOKIE = "gradscape_token"


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8050
    token: str | None = None  # required on every request when set
    allowed_hosts: tuple[str, ...] = ()  # extra Host names accepted besides loopback (and the bind host)
    notify_interval: float = 0.1  # /ui pushes are coalesced to at most ~10 Hz
    keep_last: int | None = None  # keep only the newest N steps of each run and rank (`serve --keep-last N`)
    # freeze the page's decoded graphs (tracer/collector.py, NOTE [Kept frozen]): only in a process whose
    # heap is the server's own (`gradscape serve`), never in a notebook's or a training script's
    freeze_graphs: bool = False

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK

    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        base = f"http://{host}:{self.port}/"
        return base + (f"?token={self.token}" if self.token else "")

    def token_ok(self, token: Any) -> bool:
        """Whether `token` opens this server (anything does when it has none); compared in constant time."""
        want = self.token
        if not want:
            return True
        return isinstance(token, str) and hmac.compare_digest(token.encode(), want.encode())


def resolve_token(host: str, token: str | None) -> str | None:
    """Loopback needs no token unless one is given; anywhere else one is required (generated)."""
    if token:
        return token
    return None if host in LOOPBACK else secrets.token_urlsafe(24)


class HostCheck:
    """WSGI middleware in front of everything (Dash, Socket.IO, API): refuse foreign Host headers."""

    def __init__(self, app: Callable[..., Any], allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = {h.lower() for h in allowed}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        host = environ.get("HTTP_HOST", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if host.startswith("[") and "]" in host:
            name = host[: host.index("]") + 1]
        if name.lower() not in self.allowed:
            body = f"gradscape: Host {host!r} is not served here (DNS rebinding protection)".encode()
            start_response("403 Forbidden", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            return [body]
        return self.app(environ, start_response)


def request_token() -> str | None:
    """The token an HTTP request presents: `Authorization: Bearer`, `?token=` or the page's cookie."""
    auth = request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return auth[7:]
    return request.args.get("token") or request.cookies.get(TOKEN_COOKIE)


def foreign_origin() -> str | None:
    """The request's Origin when it is not this server's own (None when absent or the same)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return None  # scripts and curl send none; browsers send one on every cross-site POST
    parts = urlsplit(origin)
    if parts.scheme in ("http", "https") and parts.netloc.lower() == request.host.lower():
        return None
    return origin


def secure(server: Flask, config: ServerConfig) -> None:
    """The token gate on every HTTP request but the socket's (its namespaces check on connect), the cookie
    a `?token=` visit sets, and the Host check in front of everything."""

    @server.before_request
    def _token_gate() -> Response | None:
        if not config.token or request.path.startswith("/socket.io"):
            return None
        if not config.token_ok(request_token()):
            if request.path.startswith("/api/"):
                return Response('{"error": "missing or wrong token"}', status=401, mimetype="application/json")
            return Response("gradscape: open the URL printed at start-up (it carries the token)", status=401)
        return None

    @server.after_request
    def _remember_token(resp: Response) -> Response:
        if config.token and request.args.get("token") and config.token_ok(request.args.get("token")):
            resp.set_cookie(TOKEN_COOKIE, request.args["token"], httponly=False, samesite="Strict")
        return resp

    allowed = set(LOOPBACK) | set(config.allowed_hosts)
    if not config.loopback and config.host not in ("0.0.0.0", "::"):
        allowed.add(config.host)
    if config.host in ("0.0.0.0", "::"):
        allowed = {"*"}
    if "*" not in allowed:
        server.wsgi_app = HostCheck(server.wsgi_app, allowed)  # type: ignore[method-assign]
