"""Browser tests: a real gradscape server in this process (werkzeug thread on a free loopback port)
and real headless Chromium driven by Playwright (docs/web-stack.md)."""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from werkzeug.serving import make_server

from gradscape.app.server import ServerConfig, create_app

logging.getLogger("werkzeug").setLevel(logging.ERROR)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@dataclass
class LiveServer:
    url: str
    store_path: Path
    state: Any
    console_errors: list[str] = field(default_factory=list)


def _wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(url)


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    yield from _serve(tmp_path, ServerConfig(notify_interval=0.05))


@pytest.fixture
def make_tracer(live_server: LiveServer) -> Iterator[Any]:
    """`make_tracer(model, run=..., sink=live_server.url)`: a Tracer closed when the test ends, while the
    server still runs, even when the test fails half-way (a tracer left open would leave its socket to
    be collected, and warned about, in some later test)."""
    import gradscape
    made: list[gradscape.Tracer] = []

    def make(*args: Any, **kwargs: Any) -> gradscape.Tracer:
        made.append(gradscape.Tracer(*args, **kwargs))
        return made[-1]

    yield make
    for tr in made:
        tr.close(timeout=5.0)


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A server that wants a token (as when bound beyond loopback); its `url` carries it."""
    yield from _serve(tmp_path, ServerConfig(notify_interval=0.05, token="e2e-token"), "/?token=e2e-token")


def _serve(tmp_path: Path, config: ServerConfig, entry: str = "") -> Iterator[LiveServer]:
    store = tmp_path / "ui.sqlite"
    app, sio = create_app(str(store), config)
    srv = make_server("127.0.0.1", 0, app.server, threaded=True)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{srv.server_port}"
    _wait_http(url + "/api/runs" + (f"?token={config.token}" if config.token else ""))
    yield LiveServer(url + entry, store, app.gradscape_state)
    app.gradscape_state.notifier.stop()
    for sock in list(sio.server.eio.sockets.values()):  # drop Engine.IO clients first (without waiting for a
        sock.close(wait=False, abort=True)              # closed page to drain its queue), or their threads linger
    sio.server.shutdown()
    srv.shutdown()
    srv.server_close()
    th.join(5)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1500, "height": 950})
    pg = ctx.new_page()
    pg.set_default_timeout(45_000)
    errors: list[str] = []
    warnings: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else
          warnings.append(m.text) if m.type == "warning" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.console_errors = errors  # type: ignore[attr-defined]
    pg.console_warnings = warnings  # type: ignore[attr-defined]
    yield pg
    ctx.close()
