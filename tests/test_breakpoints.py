"""Breakpoints, tracer side: what each kind matches, and that nothing waits when none is set. A real
server in this process (werkzeug on a free loopback port), a real socket link, training on a thread
(its backward pauses there while the test drives the JSON API)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from bp_harness import call, paused, wait_for
from bp_worker import build, params_hex, train
from werkzeug.serving import make_server

import tracer
from app.server import ServerConfig, create_app
from tracer._breakpoints import Breaker, breaker, check_breakpoint
from tracer._socket_sink import SocketSink


class _Srv:
    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str) -> Any:
        return call(self, "GET", path)[1]


_running: list[Training] = []


@pytest.fixture
def srv(tmp_path: Any) -> Iterator[_Srv]:
    app, sio = create_app(str(tmp_path / "bp.sqlite"), ServerConfig(notify_interval=0.05))
    http = make_server("127.0.0.1", 0, app.server, threaded=True)
    th = threading.Thread(target=http.serve_forever, daemon=True)
    th.start()
    yield _Srv(f"http://127.0.0.1:{http.server_port}")
    while _running:  # a failed test leaves no backward paused behind it
        t = _running.pop()
        t.tr.close(5)
        t.thread.join(30)
    for quitting in [x for x in threading.enumerate() if x.name.endswith("disconnect")]:
        quitting.join(10)  # the socket clients' disconnects, before their server goes
    app._gradscape_state.notifier.stop()
    for sock in list(sio.server.eio.sockets.values()):
        sock.close(wait=False, abort=True)
    sio.server.shutdown()
    http.shutdown()
    http.server_close()
    th.join(5)


class Training:
    """The bp_worker MLP trained on a thread, traced into the server, with breakpoints set first."""

    def __init__(self, srv: _Srv, run: str, points: list[dict[str, Any]], steps: int = 2,
                 blowup: int | None = None) -> None:
        self.run = run
        self.model, self.x, self.y = build()
        self.sink = SocketSink(srv.url, run, break_grace=5.0)
        self.tr = tracer.Tracer(self.model, run=run, sink=self.sink)
        self.breaker = breaker(run)
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
            train(self.model, self.x, self.y, steps, self.tr, blowup)
        except BaseException as exc:
            self.error = exc

    def finish(self, srv: _Srv) -> None:
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


def reference(steps: int = 2, blowup: int | None = None) -> dict[str, str]:
    model, x, y = build()
    train(model, x, y, steps, None, blowup)
    return params_hex(model)


def test_breakpoint_forms() -> None:
    assert check_breakpoint({"on": "node", "name": "AddmmBackward0"}) == {"on": "node", "name": "AddmmBackward0"}
    assert check_breakpoint({"on": "node", "id": 12}) == {"on": "node", "id": 12}
    assert check_breakpoint({"on": "module", "name": "fc2", "extra": 1}) == {"on": "module", "name": "fc2"}
    assert check_breakpoint({"on": "norm", "above": 1000}) == {"on": "norm", "above": 1000.0}
    assert check_breakpoint({"on": "nonfinite"}) == {"on": "nonfinite"}
    for bad, message in [({"on": "norm", "above": float("nan")}, "finite number"),
                         ({"on": "norm", "above": True}, "finite number"),
                         ({"on": "node", "id": -1}, "non-negative"),
                         ({"on": "node", "name": ""}, "1..200 characters"),
                         ({"on": None}, '"on" must be one of'), ("node", "JSON object")]:
        with pytest.raises(ValueError, match=message):
            check_breakpoint(bad)


def test_no_breakpoint_no_check(srv: _Srv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connected tracer with no breakpoint set never leaves the one attribute test in its hooks."""
    calls: list[int] = []
    monkeypatch.setattr(Breaker, "at_node", lambda *a: calls.append(1))
    t = Training(srv, "none", [])
    t.thread.join(60)
    t.finish(srv)
    assert calls == [] and not t.breaker.armed and t.breaker.pauses == 0
    assert params_hex(t.model) == reference()


def test_node_by_id_pauses_there_each_step(srv: _Srv) -> None:
    t = Training(srv, "by-id", [{"on": "node", "id": 3}])
    for step in (0, 1):
        p = wait_for(lambda: (lambda q: q if q and q["step"] == step else None)(paused(srv, "by-id")),  # noqa: B023
                     what=f"the pause in step {step}")
        assert p["node"]["id"] == 3
        call(srv, "POST", "/api/runs/by-id/resume", {"mode": "continue"})
    t.finish(srv)
    assert t.breaker.pauses == 2
    assert params_hex(t.model) == reference()


def test_module_pauses_at_its_first_node(srv: _Srv) -> None:
    t = Training(srv, "mod", [{"on": "module", "name": "fc1"}])
    p = wait_for(lambda: paused(srv, "mod"), what="the pause")
    nodes = srv.api("/api/runs/mod/paused/nodes")["nodes"]
    assert p["node"]["module"] == "fc1" or nodes[-1]["param"].startswith("fc1.")
    # no node before it belonged to fc1: it is the first of the module to run
    assert all(n["module"] != "fc1" and not (n["param"] or "").startswith("fc1.") for n in nodes[:-1])
    t.finish(srv)
    assert params_hex(t.model) == reference()


def test_nonfinite_pauses_once_at_the_first_bad_gradient(srv: _Srv) -> None:
    t = Training(srv, "nan", [{"on": "nonfinite"}], steps=2, blowup=1)
    p = wait_for(lambda: paused(srv, "nan"), what="the pause")
    assert p["step"] == 1  # step 0 has finite gradients everywhere
    nodes = srv.api("/api/runs/nan/paused/nodes")["nodes"]

    def bad(n: dict[str, Any]) -> bool:
        ts = (n["grad_inputs"] or []) + n["grad_outputs"]
        return any(x is not None and (x["stats"]["nan"] or x["stats"]["inf"]) for x in ts)

    assert bad(nodes[-1]) and not any(bad(n) for n in nodes[:-1])
    # the loss of that step is NaN, so torch's own gradient of it is NaN as well
    model, x, y = build()
    train(model, x, y, 1, None)
    loss = torch.nn.functional.cross_entropy(model(x * float("inf")), y)
    (g,) = torch.autograd.grad(loss, model.fc2.weight)
    assert not torch.isfinite(g).all()
    call(srv, "POST", "/api/runs/nan/resume", {"mode": "continue"})
    wait_for(lambda: not t.thread.is_alive(), what="the end of training")  # once per step: no second pause
    t.finish(srv)
    assert t.breaker.pauses == 1


def test_norm_threshold(srv: _Srv) -> None:
    never = Training(srv, "norm-high", [{"on": "norm", "above": 1e9}])
    never.thread.join(60)
    never.finish(srv)
    assert never.breaker.pauses == 0
    t = Training(srv, "norm-low", [{"on": "norm", "above": 0.0}])
    p = wait_for(lambda: paused(srv, "norm-low"), what="the pause")
    assert p["executed"] == 1 and p["step"] == 0  # the loss's node already sends a non-zero gradient
    call(srv, "POST", "/api/runs/norm-low/resume", {"mode": "continue"})
    p = wait_for(lambda: (lambda q: q if q and q["step"] == 1 else None)(paused(srv, "norm-low")), what="step 1")
    assert p["executed"] == 1  # once per step: step 0 did not pause again
    t.finish(srv)
    assert t.breaker.pauses == 2
