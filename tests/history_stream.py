"""A training loop streaming its history (tests/history_worker.py) into a live server, in a subprocess, for
the browser tests that watch the page while a run streams: started, waited on until the server has what
the test needs, and killed when the test ends."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from serving import TESTS, get_json


def history_rows(url: str, run: str) -> list[dict[str, Any]]:
    """The run's history rows on the server, [] before the run is there."""
    try:
        return list(get_json(f"{url}/api/runs/{run}/history")["steps"])
    except Exception:  # the run is not there yet
        return []


def stored_steps(url: str, run: str) -> list[int]:
    """The run's stored (traced) steps on the server, [] before the run is there."""
    try:
        return [s["step"] for s in get_json(f"{url}/api/runs/{run}/steps")["steps"]]
    except Exception:  # the run is not there yet
        return []


@contextmanager
def streaming_history(url: str, run: str, ready: Callable[[], bool], *args: str,
                      timeout: float = 90) -> Iterator[None]:
    """history_worker.py `args` streaming `run` to `url`, once `ready()` holds."""
    proc = subprocess.Popen([sys.executable, str(TESTS / "history_worker.py"), "--url", url, "--run", run, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert time.monotonic() < deadline, f"{run}: what the test waits for did not arrive"
            time.sleep(0.1)
        yield
    finally:
        proc.kill()
        proc.communicate(timeout=30)
