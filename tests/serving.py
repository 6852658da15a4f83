"""Real servers for the server tests: `gradscape serve` in a subprocess on a free loopback port."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def free_port() -> int:
    """A port nothing listens on right now (for "no server there" cases); a server to talk to binds port 0
    itself instead (`Server`), as a port freed here may be taken before the server binds it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ApiError(Exception):
    """An HTTP error answer, read and closed (an unread HTTPError keeps its socket open)."""

    def __init__(self, code: int, body: str) -> None:
        super().__init__(f"{code}: {body}")
        self.code, self.body = code, body


def get_json(url: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> Any:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        exc.close()
        raise ApiError(exc.code, body) from None


def wait_http(url: str, timeout: float = 30.0, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            get_json(url, headers, timeout=2)
            return
        except ApiError:
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing answered at {url}")


class Server:
    """`gradscape serve` in a subprocess. Port 0 (the default): the server binds a free port itself and
    prints its URL, read here; a restart binds the port it had."""

    command = ("-m", "gradscape")  # after the interpreter, before `serve`

    def __init__(self, store: Path, port: int = 0, *extra: str) -> None:
        self.store, self.port, self.extra = store, port, extra
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[str] | None = None
        self.log = store.with_suffix(".serve.log")

    def start(self, timeout: float = 60.0) -> Server:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log, "a") as log:
            start = log.tell()
            cmd = [sys.executable, *self.command, "serve", "--store", str(self.store), "--port", str(self.port)]
            self.proc = subprocess.Popen([*cmd, *self.extra], stdout=log, stderr=subprocess.STDOUT,
                                         text=True, cwd=ROOT, env=env)
        if self.port == 0:
            self.port = self._bound_port(start, timeout)
            self.url = f"http://127.0.0.1:{self.port}"
        try:
            wait_http(self.url + "/api/runs", timeout)
        except TimeoutError:
            with open(self.log) as log:
                log.seek(start)
                tail = log.read()[-2000:]
            raise TimeoutError(f"gradscape serve did not answer in {timeout:g} s; its log:\n{tail}") from None
        return self

    def _bound_port(self, start: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log) as log:
                log.seek(start)
                found = re.search(r"gradscape serving .* at http://[^:/]+:(\d+)/", log.read())
            if found:
                return int(found.group(1))
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"gradscape serve exited ({self.proc.returncode}); see {self.log}")
            time.sleep(0.05)
        raise TimeoutError(f"gradscape serve printed no URL within {timeout:.0f} s; see {self.log}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def api(self, path: str, **kw: Any) -> Any:
        return get_json(self.url + path, **kw)


def worker(url: str, run: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(TESTS / "stream_worker.py"), "--url", url, "--run", run, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    return json.loads(out.strip().splitlines()[-1])
