"""Test-side helpers for the breakpoint tests: the training subprocess (tests/bp_worker.py), JSON calls
to a server, condition waits, a server and training on threads of the test process
(tests/test_breakpoints*.py), and paused thumbnails read back as numbers."""

from __future__ import annotations

import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bp_worker import build, params_hex, train
from serving import ROOT, TESTS
from werkzeug.serving import make_server

import gradscape
from gradscape.app.data import PageData
from gradscape.app.server import ServerConfig, create_app
from gradscape.tracer.record.debug.breakpoints import breaker
from gradscape.tracer.sinks.socket import SocketSink


class Worker:
    """The training subprocess, its stdout read line by line on a thread."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, str(TESTS / "bp_worker.py"), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, want: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            self.seen.append(line)
            if line.startswith(want):
                return line

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 60.0) -> tuple[dict[str, Any], str]:
        self.proc.wait(timeout)
        assert self.proc.stderr is not None
        err = self.proc.stderr.read()
        assert self.proc.returncode == 0, err
        return json.loads(self.expect("{", 5)), err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def call(srv: Any, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
         raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(srv.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        text = exc.read().decode()
        exc.close()
        return exc.code, json.loads(text)  # every answer is JSON, errors included


def wait_for(cond: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise TimeoutError(what)


def paused(srv: Any, run: str, executed: int | None = None) -> Any:
    p = srv.api(f"/api/runs/{run}/paused")
    return p if p["paused"] and (executed is None or p["executed"] == executed) else None


def reference_params() -> dict[str, str]:
    out = subprocess.run([sys.executable, str(TESTS / "bp_worker.py"), "--steps", "3"], capture_output=True,
                         text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["params"]  # type: ignore[no-any-return]


def logits_grad_norm() -> float:
    """‖dL/d(fc2 output)‖ of step 0, from torch.autograd.grad: what arrives at fc2's AddmmBackward0."""
    model, x, y = build()
    logits = model(x)
    (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, y), logits)
    return float(g.norm())


# ---------------------------------------------------------------- a server and training on threads
class ThreadServer:
    """A server on a thread of the test process (`serve_in_thread`): its URL and what its page reads."""

    def __init__(self, url: str, page: Any = None) -> None:
        self.url = url
        self.page = page  # what the server's page reads (app/data.py): its paused state included

    def api(self, path: str) -> Any:
        return call(self, "GET", path)[1]


_running: list[Training] = []


def serve_in_thread(tmp_path: Path) -> Iterator[ThreadServer]:
    """A real server in this process (werkzeug on a free loopback port); once the caller is done, any
    training left running is closed and the server shut down."""
    app, sio = create_app(str(tmp_path / "bp.sqlite"), ServerConfig(notify_interval=0.05))
    http = make_server("127.0.0.1", 0, app.server, threaded=True)
    th = threading.Thread(target=http.serve_forever, daemon=True)
    th.start()
    state = app.gradscape_state
    yield ThreadServer(f"http://127.0.0.1:{http.server_port}", PageData(state.store, state.debug))
    while _running:  # a failed test leaves no backward paused behind it
        t = _running.pop()
        t.tr.close(5)
        t.thread.join(30)
    for quitting in [x for x in threading.enumerate() if x.name.endswith("disconnect")]:
        quitting.join(10)  # the socket clients' disconnects, before their server goes
    app.gradscape_state.notifier.stop()
    for sock in list(sio.server.eio.sockets.values()):
        sock.close(wait=False, abort=True)
    sio.server.shutdown()
    http.shutdown()
    http.server_close()
    th.join(5)


class Training:
    """The bp_worker MLP trained on a thread, traced into the server, with breakpoints set first."""

    def __init__(self, srv: ThreadServer, run: str, points: list[dict[str, Any]], steps: int = 2,
                 blowup: int | None = None, thumb: int = 64, budget: int | None = None, device: str = "cpu") -> None:
        self.run = run
        self.model, self.x, self.y = build(device=device)
        self.sink = SocketSink(srv.url, run, break_grace=5.0)
        self.tr = gradscape.Tracer(self.model, run=run, sink=self.sink, thumb=thumb)
        self.breaker = breaker(run)
        if budget is not None:
            self.breaker.thumb_budget = budget
        wait_for(lambda: self.breaker.link is not None and self.breaker.link.connected, what="the link")
        for bp in points:
            assert call(srv, "POST", f"/api/runs/{run}/breakpoints", bp)[0] == 201
        wait_for(lambda: len(self.breaker.points) == len(points), what="the breakpoints pushed")
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._train, args=(steps, blowup), daemon=True)
        self.thread.start()
        _running.append(self)

    def _train(self, steps: int, blowup: int | None) -> None:
        try:
            if self.x.is_cuda:  # a new thread has no current CUDA context: cuBLAS warns (an error here) without one
                torch.cuda.set_device(self.x.device)
            train(self.model, self.x, self.y, steps, self.tr, blowup)
        except BaseException as exc:
            self.error = exc

    def pause_in(self, srv: ThreadServer, step: int, timeout: float = 30.0) -> Any:
        """Wait for this run's pause in `step`; training that ended first fails here with its error."""
        def seen() -> Any:
            if self.error is not None:
                raise AssertionError(f"training failed before the pause in step {step}") from self.error
            q = paused(srv, self.run)
            return q if q and q["step"] == step else None

        return wait_for(seen, timeout, f"the pause in step {step}")

    def finish(self, srv: ThreadServer) -> None:
        call(srv, "DELETE", f"/api/runs/{self.run}/breakpoints")
        while self.thread.is_alive():
            if paused(srv, self.run):
                call(srv, "POST", f"/api/runs/{self.run}/resume", {"mode": "continue"})
            self.thread.join(0.05)
        self.tr.close(10)
        assert self.error is None
        if self in _running:
            _running.remove(self)
        for quitting in [x for x in threading.enumerate() if x.name.endswith("disconnect")]:
            quitting.join(10)


def reference(steps: int = 2, blowup: int | None = None, device: str = "cpu") -> dict[str, str]:
    """The parameters after the same training untraced (bytes as hex)."""
    model, x, y = build(device=device)
    train(model, x, y, steps, None, blowup)
    return params_hex(model)


# ---------------------------------------------------------------- paused thumbnails as numbers
WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def thumb_values(thumb: dict[str, Any]) -> np.ndarray:
    """A thumbnail as the route answers it, back to numbers (its NaN/±Inf strings included)."""
    rows = [[WORDS[v] if isinstance(v, str) else v for v in row] for row in thumb["values"]]
    return np.array(rows, dtype=np.float64).reshape(thumb["shape"])


def as_2d(g: torch.Tensor) -> np.ndarray:
    """A gradient of rank ≤ 2 in its thumbnail's view (NOTE [Thumbnail views]): a vector is a 1×n strip."""
    a = g.detach().double().numpy()
    return a.reshape(1, -1) if a.ndim == 1 else a
