"""`gradscape.show(x)`: the interactive page inside a notebook.

    view = gradscape.show(st)          # a StepTrace, a Tracer, or a trace file's path
    view.url                           # the page's address

A gradscape server is started on demand, on loopback and a free port, in a daemon thread of the
kernel: one for the steps shown, one per shown tracer's run (each in a file of the session's own, in a
temporary folder removed at the end), one per trace file shown by path; a later call reuses it, and it
stops when the interpreter exits (the kernel shuts down). The
notebook gets an iframe of the page. A `Tracer` gets one more sink, which stores each step it traces
in its server's file and tells the page at once, so the page follows its run live.

Where the kernel runs on another machine than the browser (ssh, JupyterHub, Codespaces, Colab), an
iframe of 127.0.0.1 would be blank: `show` says how to forward the port instead. `GRADSCAPE_REMOTE=0`
or `=1` overrides the guess.
"""

from __future__ import annotations

import atexit
import html
import ipaddress
import logging
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from gradscape.tracer._model import StepTrace

log = logging.getLogger(__name__)
SESSION = "<session>"  # the key of the session's own trace file of the steps shown
_lock = threading.Lock()
_servers: dict[str, _Server] = {}


@dataclass
class _Server:
    """One gradscape server in a thread of this process, over one trace file."""

    app: Any  # GradscapeApp
    srv: Any  # werkzeug's server
    thread: threading.Thread
    port: int
    folder: str | None = None  # a temporary folder of the session's own, removed when the server stops

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def stop(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
        self.app.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _start(store: str, folder: str | None = None) -> _Server:
    from werkzeug.serving import make_server

    from gradscape.app.server import ServerConfig, create_app

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no request lines in the notebook's output
    config = ServerConfig(host="127.0.0.1", port=0)
    app = create_app(store, config)
    srv = make_server("127.0.0.1", 0, app.dash.server, threaded=True)
    config.port = srv.server_port
    thread = threading.Thread(target=srv.serve_forever, name="gradscape-notebook-server", daemon=True)
    thread.start()
    return _Server(app, srv, thread, srv.server_port, folder)


def server(store: str | None = None, *, own: str = SESSION) -> _Server:
    """The running server of trace file `store`, started if needed. `store` None: a file of the session's
    own, one per `own` (the steps shown, and each shown tracer's run)."""
    key = own if store is None else str(Path(store).resolve())
    with _lock:
        if key not in _servers:
            if store is None:
                folder = tempfile.mkdtemp(prefix="gradscape-")
                _servers[key] = _start(str(Path(folder) / "notebook.sqlite"), folder)
            elif not Path(key).is_file():
                raise FileNotFoundError(f"gradscape.show: no trace file at {store}")
            else:
                _servers[key] = _start(key)
        return _servers[key]


def stop() -> None:
    """Stop every server `show` started (also done at interpreter exit)."""
    with _lock:
        items = list(_servers.values())
        _servers.clear()
    for s in items:
        try:
            s.stop()
        except Exception as exc:  # at exit: never raise
            log.warning("gradscape: stopping the notebook server on port %s failed: %s", s.port, exc)


atexit.register(stop)


class _PageSink:
    """A sink a shown `Tracer` gets: it stores each step in the server's trace file and tells the
    page, as the server does for a streamed step (in-process, so no socket and no copy)."""

    def __init__(self, srv: _Server) -> None:
        self.srv = srv
        self.stats = {"written": 0, "dropped": 0}

    def write(self, st: StepTrace) -> None:
        self.srv.app.state.store_step(st)
        self.stats["written"] += 1

    def close(self, timeout: float = 10.0) -> None:
        return None  # the server owns the file


def remote_reason() -> str | None:
    """Why the browser is probably not on the kernel's machine (None: it is, or we cannot tell)."""
    forced = os.environ.get("GRADSCAPE_REMOTE")
    if forced is not None:
        return "GRADSCAPE_REMOTE=1" if forced not in ("", "0") else None
    for var, what in (("JUPYTERHUB_API_URL", "JupyterHub"), ("CODESPACES", "GitHub Codespaces"),
                      ("COLAB_RELEASE_TAG", "Google Colab"), ("KAGGLE_KERNEL_RUN_TYPE", "Kaggle"),
                      ("SSH_CONNECTION", "an ssh session")):
        if os.environ.get(var):
            return f"the kernel runs in {what} ({var} is set)"
    ip = _kernel_ip()
    if ip is not None:
        try:
            if not ipaddress.ip_address(ip).is_loopback:
                return f"the kernel listens on {ip}, not on loopback"
        except ValueError:
            return f"the kernel listens on {ip}, not on loopback"
    return None


def _kernel_ip() -> str | None:
    """The address the Jupyter kernel listens on, when this runs in one."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None  # type: ignore[attr-defined]
    kernel = getattr(shell, "kernel", None)
    ip = getattr(kernel, "ip", None) or getattr(getattr(kernel, "parent", None), "ip", None)
    return ip if isinstance(ip, str) and ip else None


def forward_hint(port: int, reason: str) -> str:
    """How to reach a server on the kernel's loopback from the browser's machine."""
    conn = os.environ.get("SSH_CONNECTION", "").split()
    host = conn[2] if len(conn) >= 4 else "KERNEL_HOST"
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or "you"
    return (f"gradscape: the page is served on the kernel's machine at 127.0.0.1:{port}, and {reason}, so an "
            f"iframe here would stay blank. Forward the port, on your own machine:\n"
            f"    ssh -N -L {port}:127.0.0.1:{port} {user}@{host}\n"
            f"then open http://127.0.0.1:{port}/ there (with jupyter-server-proxy installed on the server, "
            f"<your notebook URL's base>/proxy/{port}/ works too).")


class PageView:
    """What `show` returns: `url` is the page's address; in a notebook it displays as an iframe of the
    page, or (kernel on another machine) as how to forward the port."""

    def __init__(self, url: str, port: int, height: int, remote: str | None) -> None:
        self.url, self.port, self.height, self.remote = url, port, height, remote

    def __repr__(self) -> str:
        return f"gradscape page at {self.url}" + (f" (remote kernel: {self.remote})" if self.remote else "")

    def _repr_html_(self) -> str:
        if self.remote:
            return f"<pre>{html.escape(forward_hint(self.port, self.remote))}</pre>"
        return (f'<iframe src="{html.escape(self.url)}" width="100%" height="{self.height}" '
                f'style="border:1px solid #ddd" title="gradscape"></iframe>')


def show(x: Any, *, height: int = 760, display: bool = True) -> PageView:
    """Show `x` (a `StepTrace`, a `Tracer`, or a trace file's path) on the interactive page, inside the
    notebook; returns the `PageView` (its `url`). `display=False` only starts the server."""
    srv, query = _serve(x)
    url = srv.base + (("?" + urlencode(query)) if query else "")
    view = PageView(url, srv.port, height, remote_reason())
    if display:
        _display(view)
    return view


def _serve(x: Any) -> tuple[_Server, dict[str, Any]]:
    if isinstance(x, StepTrace):
        srv = server()
        _PageSink(srv).write(x)
        query: dict[str, Any] = {"run": x.run, "step": x.step}
        if x.rank:
            query["rank"] = x.rank
        return srv, query
    if isinstance(x, (str, os.PathLike)):
        return server(os.fspath(x)), {}
    if hasattr(x, "sinks") and hasattr(x, "run") and hasattr(x, "step"):  # a Tracer (not imported: it needs torch)
        # a file of its own: the page of a store with no run yet follows the first run that appears (a
        # link to a run that is not there yet would show another run of a shared file, and stay there)
        srv = server(own=f"{SESSION} tracer {x.run}")
        if not any(isinstance(s, _PageSink) and s.srv is srv for s in x.sinks):
            sink = _PageSink(srv)
            for st in getattr(x, "steps", []):  # what it traced already
                sink.write(st)
            x.sinks.append(sink)
        return srv, {"run": x.run}
    raise TypeError(f"gradscape.show takes a StepTrace, a Tracer or a trace file's path, got {type(x).__name__}")


def _display(view: PageView) -> None:
    ipython = sys.modules.get("IPython")
    if ipython is None or ipython.get_ipython() is None:  # type: ignore[attr-defined]
        return  # not in a notebook: the view's `url` (and repr) say where the page is
    from IPython.display import display

    display(view)
