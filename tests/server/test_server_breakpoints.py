"""Breakpoints end to end with real parts: `gradscape serve` in a subprocess, a real training
subprocess (tests/bp_worker.py) streaming into it, the JSON API driven over HTTP."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from bp_harness import call, logits_grad_norm, paused, reference_params, wait_for
from serving import ApiError, Server

from gradscape.tracer.record.debug.breakpoints import BreakpointLink


def test_pause_step_continue_bitwise(server: Server, worker_factory: Any) -> None:
    w = worker_factory("--url", server.url, "--run", "bp", "--steps", "3")
    w.expect("ready")
    code, body = call(server, "POST", "/api/runs/bp/breakpoints", {"on": "node", "name": "AddmmBackward0"})
    assert code == 201 and body["breakpoints"] == [{"on": "node", "name": "AddmmBackward0"}]
    w.go()
    p = wait_for(lambda: paused(server, "bp"), what="the first pause")
    assert p["step"] == 0 and p["node"]["name"] == "AddmmBackward0" and p["node"]["module"] == "fc2"
    assert p["node"]["source"] and p["node"]["source"].startswith("bp_worker.py:")
    k = p["executed"]
    # the partial backward: every node run so far, the paused one last, with its gradients' statistics
    doc = server.api("/api/runs/bp/paused/nodes")
    assert len(doc["nodes"]) == k and doc["nodes"][-1]["id"] == p["node"]["id"]
    arrived = doc["nodes"][-1]["grad_outputs"][0]
    assert arrived["shape"] == [16, 3]
    assert arrived["stats"]["norm"] == pytest.approx(logits_grad_norm(), rel=1e-5)
    # the process does not advance while paused
    time.sleep(0.5)
    assert w.lines.empty() and paused(server, "bp", k)
    # a cross-origin write is refused and changes nothing
    evil = {"Origin": "http://evil.example"}
    assert call(server, "POST", "/api/runs/bp/resume", {"mode": "continue"}, evil)[0] == 403
    assert call(server, "POST", "/api/runs/bp/breakpoints", {"on": "nonfinite"}, evil)[0] == 403
    assert call(server, "DELETE", "/api/runs/bp/breakpoints", None, evil)[0] == 403
    assert server.api("/api/runs/bp/breakpoints")["breakpoints"] == [{"on": "node", "name": "AddmmBackward0"}]
    assert paused(server, "bp", k)
    # the page's own origin is accepted; step: exactly one more node
    own = {"Origin": server.url}
    assert call(server, "POST", "/api/runs/bp/resume", {"mode": "step"}, own) == (200, {"run": "bp",
                                                                                       "resumed": "step"})
    p2 = wait_for(lambda: paused(server, "bp", k + 1), what="the pause after one step")
    assert p2["step"] == 0 and p2["node"]["id"] != p["node"]["id"]
    # continue: to the next hit (fc1's addmm, later in the same backward)
    assert call(server, "POST", "/api/runs/bp/resume", {"mode": "continue"})[0] == 200
    p3 = wait_for(lambda: (lambda q: q if q and q["executed"] > k + 1 else None)(paused(server, "bp")),
                  what="the second hit")
    assert p3["node"]["name"] == "AddmmBackward0" and p3["node"]["module"] == "fc1" and p3["step"] == 0
    # cleared: the run goes to its end
    assert call(server, "DELETE", "/api/runs/bp/breakpoints") == (200, {"run": "bp", "breakpoints": []})
    assert call(server, "POST", "/api/runs/bp/resume", {"mode": "continue"})[0] == 200
    out, err = w.result()
    assert out["pauses"] == 3
    assert out["params"] == reference_params()
    assert server.api("/api/runs/bp/paused") == {"paused": False}


def test_server_killed_while_paused_resumes_after_grace(server: Server, worker_factory: Any) -> None:
    w = worker_factory("--url", server.url, "--run", "gone", "--steps", "3", "--grace", "1.0")
    w.expect("ready")
    assert call(server, "POST", "/api/runs/gone/breakpoints", {"on": "module", "name": "fc1"})[0] == 201
    w.go()
    wait_for(lambda: paused(server, "gone"), what="the pause")
    server.kill()
    t0 = time.monotonic()
    out, err = w.result(timeout=60)
    assert time.monotonic() - t0 < 30
    assert err.count("unreachable for 1 s; training resumes") == 1, err
    assert out["pauses"] == 1  # the breakpoints went with the server
    assert out["params"] == reference_params()


def test_ctrl_c_while_paused(server: Server, worker_factory: Any) -> None:
    w = worker_factory("--url", server.url, "--run", "intr", "--steps", "3")
    w.expect("ready")
    assert call(server, "POST", "/api/runs/intr/breakpoints", {"on": "node", "id": 1})[0] == 201
    w.go()
    wait_for(lambda: paused(server, "intr"), what="the pause")
    w.proc.send_signal(signal.SIGINT)
    w.proc.wait(20)
    assert w.proc.returncode != 0
    assert w.proc.stderr is not None and "KeyboardInterrupt" in w.proc.stderr.read()


def test_bad_input_is_a_json_4xx(server: Server) -> None:
    link = BreakpointLink(server.url, "known", grace=1.0)
    try:
        wait_for(lambda: link.connected, what="the link")
        cases = [
            ({"on": "watch"}, '"on" must be one of'),
            ({"on": "node"}, 'exactly one of "name"'),
            ({"on": "node", "name": "A", "id": 1}, 'exactly one of "name"'),
            ({"on": "node", "id": "x"}, '"id" must be a non-negative integer'),
            ({"on": "module"}, 'needs "name"'),
            ({"on": "module", "name": 3}, '"name" must be a string'),
            ({"on": "norm"}, 'needs "above"'),
            ({"on": "norm", "above": "big"}, '"above" must be a finite number'),
            ([1, 2], "JSON object"),
        ]
        for body, message in cases:
            code, answer = call(server, "POST", "/api/runs/known/breakpoints", body)
            assert code == 400 and message in answer["error"], (body, answer)
        assert call(server, "POST", "/api/runs/known/breakpoints", raw=b"{not json")[1] == {
            "error": "the body must be a JSON object"}
        code, answer = call(server, "POST", "/api/runs/nobody/breakpoints", {"on": "nonfinite"})
        assert code == 404 and "no run 'nobody'" in answer["error"]
        assert call(server, "GET", "/api/runs/nobody/paused")[0] == 404
        code, answer = call(server, "POST", "/api/runs/known/resume", {"mode": "run"})
        assert code == 400 and '"mode" must be "step" or "continue"' in answer["error"]
        code, answer = call(server, "POST", "/api/runs/known/resume", {"mode": "step"})
        assert code == 409 and "not paused" in answer["error"]
        code, answer = call(server, "PUT", "/api/runs/known/breakpoints", {"on": "nonfinite"})
        assert code == 405 and "PUT" in answer["error"]
        assert call(server, "GET", "/api/runs/known/paused/nodes")[0] == 409
        # nothing accepted was lost, and the tracer heard every change
        assert call(server, "POST", "/api/runs/known/breakpoints", {"on": "norm", "above": 5})[0] == 201
        assert call(server, "POST", "/api/runs/known/breakpoints", {"on": "node", "id": 4})[0] == 201
        want = [{"on": "norm", "above": 5.0}, {"on": "node", "id": 4}]
        assert server.api("/api/runs/known/breakpoints")["breakpoints"] == want
        wait_for(lambda: link.breaker.points == want and link.breaker.armed, what="the push")
        assert call(server, "DELETE", "/api/runs/known/breakpoints")[0] == 200
        wait_for(lambda: link.breaker.points == [] and not link.breaker.armed, what="the clear")
    finally:
        link.close()


def test_token_server_needs_the_token(tmp_path: Path) -> None:
    srv = Server(tmp_path / "t.sqlite", 0, "--host", "127.0.0.1", "--token", "sekrit").start()
    try:
        with pytest.raises(ApiError) as e:
            srv.api("/api/runs/x/paused")
        assert e.value.code == 401
        code, body = call(srv, "POST", "/api/runs/x/breakpoints", {"on": "nonfinite"})
        assert code == 401 and "token" in body["error"]
    finally:
        srv.stop()
