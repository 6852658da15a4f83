"""The socket sink's threads (NOTE [Sink threads] in gradscape.tracer.sinks.socket): none before the first step
but the breakpoint link (a breakpoint set before the first step must pause its backward), and none
left once the Tracer is closed or dropped and collected, with every step delivered or spilled."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from serving import Server, free_port

import gradscape


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("gradscape-")}


def _wait_ended(threads: set[threading.Thread], timeout: float = 30.0) -> set[threading.Thread]:
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return {t for t in threads if t.is_alive()}


def _one_step(tr: gradscape.Tracer, model: nn.Module) -> None:
    with tr.step(0):
        model(torch.randn(2, 3)).sum().backward()


def test_threads_start_with_the_first_step_and_end_with_close(server: Server) -> None:
    before = _threads()
    model = nn.Linear(3, 1)
    tr = gradscape.Tracer(model, sink=server.url, run="closed")
    assert {t.name for t in _threads() - before} == {"gradscape-breakpoints"}  # no sender yet
    _one_step(tr, model)
    started = _threads() - before
    assert {t.name for t in started} == {"gradscape-sender", "gradscape-spill", "gradscape-breakpoints"}
    tr.close()
    assert not _wait_ended(started)
    assert [s["step"] for s in server.api("/api/runs/closed/steps")["steps"]] == [0]


def test_dropped_tracers_leave_no_thread_and_lose_no_step(server: Server) -> None:
    before = _threads()
    model = nn.Linear(3, 1)
    for k in range(3):
        tr = gradscape.Tracer(model, sink=server.url, run=f"dropped-{k}")
        _one_step(tr, model)
    started = _threads() - before
    assert len(started) >= 6 - 2  # the last Tracer is still referenced here
    del tr
    gc.collect()
    assert not _wait_ended(_threads() - before)
    for k in range(3):
        assert [s["step"] for s in server.api(f"/api/runs/dropped-{k}/steps")["steps"]] == [0]


def test_a_dropped_tracer_with_no_server_spills_and_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADSCAPE_DATA_DIR", str(tmp_path))  # the spill file's folder (tracer/sinks/paths.py)
    before = _threads()
    model = nn.Linear(3, 1)
    tr = gradscape.Tracer(model, sink=f"http://127.0.0.1:{free_port()}", run="nobody")
    with pytest.warns(RuntimeWarning, match="spill"):
        _one_step(tr, model)
        started = _threads() - before
        del tr
        gc.collect()
        assert not _wait_ended(started | (_threads() - before))
    assert gradscape.load(str(tmp_path / "spill" / "gradscape-spill-nobody.sqlite")).step == 0
