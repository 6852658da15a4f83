"""The monitor's history through the real parts: a training process streams it to `gradscape serve`,
which stores it (`TraceStore.history`) and serves it (`GET /api/runs/<run>/history`); malformed
history messages are answered with an error that names what was wrong."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving import TESTS, ApiError, Server, finish

import gradscape
from gradscape.app.server import GradscapeApp, ServerConfig, create_app
from gradscape.tracer import protocol
from gradscape.tracer.wire import pack
from gradscape.tracer.wire.history import history_to_wire


def history_worker(url: str, run: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(TESTS / "history_worker.py"), "--url", url, "--run", run, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_history_streams_into_the_store_and_the_route(server: Server) -> None:
    res = finish(history_worker(server.url, "h", "--steps", "40", "--every", "10", "--spike", "35"))
    mine = res["history"]
    assert [r["step"] for r in mine] == list(range(40))
    got = server.api("/api/runs/h/history")
    assert got["run"] == "h" and got["rank"] == 0
    rows = got["steps"]
    assert [r["step"] for r in rows] == list(range(40))
    for a, b in zip(rows, mine):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] and a["lr"] == b["lr"]
        assert a["param_norms"] == b["param_norms"] and a["traced"] == b["traced"] and a["trigger"] == b["trigger"]
    assert [r["step"] for r in rows if r["traced"]] == [0, 10, 20, 30, 35]
    assert rows[35]["trigger"] == "loss_spike" and all(r["trigger"] is None for r in rows[:35])
    assert set(rows[0]["param_norms"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert server.api("/api/runs/h/steps/35")["trigger"] == "loss_spike"  # the step's own record says so
    with gradscape.TraceStore(server.store, readonly=True) as store:
        stored = store.history("h")
    assert [r["loss"] for r in stored] == [r["loss"] for r in mine]
    assert server.api("/api/runs/h/history?since=35")["steps"][0]["step"] == 36
    for path, code, text in [("/api/runs/nope/history", 404, "no run 'nope'"),
                             ("/api/runs/h/history?since=x", 400, "since must be an integer")]:
        with pytest.raises(ApiError) as err:
            server.api(path)
        assert err.value.code == code and text in err.value.body


@pytest.fixture
def app(tmp_path: Path) -> Iterator[GradscapeApp]:
    created = create_app(str(tmp_path / "store.sqlite"), ServerConfig(notify_interval=0.02))
    yield created
    created.close()


def _row(step: int, **kw: object) -> dict[str, object]:
    return {"step": step, "loss": 1.0, "losses": [1.0], "grad_norm": 2.0, "grad_norm_clipped": None,
            "param_norms": [0.5], "lr": {"SGD": [0.1]}, "scale": None, "skipped": False, "traced": False,
            "trigger": None, **kw}


def test_history_messages_are_checked(app: GradscapeApp) -> None:
    dash_app, sio = app
    c = sio.test_client(dash_app.server, namespace="/tracer")
    ui = sio.test_client(dash_app.server, namespace="/ui")

    def send(batch: object, run: str = "r") -> dict[str, object]:
        data = pack(batch)
        return c.emit("history", protocol.envelope("history", run, 0, {"data": data}), namespace="/tracer",
                      callback=True)

    ok = send(history_to_wire("r", None, ["w"], [_row(0), _row(1, loss=float("nan"))]))
    assert ok == {"ok": True, "stored": 2}
    rows = app.state.store.history("r")
    assert [r["step"] for r in rows] == [0, 1] and rows[0]["param_norms"] == {"w": 0.5}
    for bad, text in [(history_to_wire("r", None, ["w"], [_row(0, param_norms=[1.0, 2.0])]), "2 values for 1"),
                      (history_to_wire("r", None, ["w"], [_row(-1)]), "rows[0].step"),
                      (history_to_wire("r", None, ["w"], [_row(0, trigger="boom")]), "rows[0].trigger"),
                      (history_to_wire("other", None, ["w"], [_row(0)]), "data is run 'other'"),
                      ({"v": 9}, "version 9")]:
        ack = send(bad)
        assert ack["ok"] is False and text in ack["error"], (text, ack)
    assert [r["step"] for r in app.state.store.history("r")] == [0, 1]  # nothing half-stored
    got: list[dict[str, object]] = []
    deadline = time.monotonic() + 10  # the notifier's thread pushes at most ~10 times a second: wait for it
    while not got and time.monotonic() < deadline:
        got = [m for m in ui.get_received("/ui") if m["name"] == "history"]
        time.sleep(0.02)
    assert got and got[-1]["args"][0] == {"run": "r", "step": 1}
