"""Test-side helpers for the breakpoint tests: the training subprocess (tests/bp_worker.py), JSON calls
to a server, and condition waits."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import torch
from serving import ROOT, TESTS


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
    sys.path.insert(0, str(TESTS))
    from bp_worker import build

    model, x, y = build()
    logits = model(x)
    (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, y), logits)
    return float(g.norm())
