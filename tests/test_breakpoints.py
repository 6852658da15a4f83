"""Breakpoints, tracer side: what each kind matches, and that nothing waits when none is set. A real
server in this process (werkzeug on a free loopback port: the `srv` fixture, tests/bp_harness.py), a real
socket link, training on a thread (its backward pauses there while the test drives the JSON API). What a
pause sends, and what is served of it, is tests/test_breakpoints_paused.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from bp_harness import ThreadServer, Training, as_2d, call, paused, reference, serve_in_thread, thumb_values, wait_for
from bp_worker import build, params_hex, train
from helpers import DEVICES

import gradscape
from gradscape.tracer.record.carry import BREAKPOINT_NEXT_STEP
from gradscape.tracer.record.debug.breakpoints import Breaker, breaker, check_breakpoint
from gradscape.tracer.sinks.socket import SocketSink


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


def test_no_breakpoint_no_check(srv: ThreadServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connected tracer with no breakpoint set never leaves the one attribute test in its hooks."""
    calls: list[int] = []
    monkeypatch.setattr(Breaker, "at_node", lambda *a: calls.append(1))
    t = Training(srv, "none", [])
    t.thread.join(60)
    t.finish(srv)
    assert calls == [] and not t.breaker.armed and t.breaker.pauses == 0
    assert params_hex(t.model) == reference()


@pytest.mark.parametrize("device", DEVICES)
def test_node_by_id_pauses_there_each_step(srv: ThreadServer, device: str) -> None:
    """On CUDA the backward runs on autograd's device thread: the pause holds that thread."""
    t = Training(srv, "by-id", [{"on": "node", "id": 3}], device=device)
    for step in (0, 1):
        p = t.pause_in(srv, step)
        assert p["node"]["id"] == 3
        call(srv, "POST", "/api/runs/by-id/resume", {"mode": "continue"})
    t.finish(srv)
    assert t.breaker.pauses == 2
    assert params_hex(t.model) == reference(device=device)


def test_a_run_traced_again_in_the_process_starts_clean(srv: ThreadServer, tmp_path: Path) -> None:
    """A second tracer of the same run in one process (a notebook cell run again, against a fresh server)
    keeps nothing of the first's breakpoints, pauses or once-a-step firings: it pauses where its own
    server says, and as often."""
    first = Training(srv, "again", [{"on": "node", "id": 3}, {"on": "nonfinite"}], steps=1)
    wait_for(lambda: paused(srv, "again"), what="the first run's pause")
    first.finish(srv)
    assert first.breaker.pauses == 1
    (tmp_path / "second").mkdir()
    servers = serve_in_thread(tmp_path / "second")
    srv2 = next(servers)
    try:
        sink = SocketSink(srv2.url, "again", break_grace=5.0)
        wait_for(lambda: breaker("again").link is not None and breaker("again").link.connected, what="the link")
        assert breaker("again").points == [] and breaker("again").pauses == 0  # the new server has none
        sink.close(10)
        second = Training(srv2, "again", [{"on": "node", "id": 3}])
        for step in (0, 1):
            second.pause_in(srv2, step)
            call(srv2, "POST", "/api/runs/again/resume", {"mode": "continue"})
        second.finish(srv2)
        assert second.breaker.pauses == 2
        assert params_hex(second.model) == reference()
    finally:
        next(servers, None)


def test_module_pauses_at_its_first_node(srv: ThreadServer) -> None:
    t = Training(srv, "mod", [{"on": "module", "name": "fc1"}])
    p = wait_for(lambda: paused(srv, "mod"), what="the pause")
    nodes = srv.api("/api/runs/mod/paused/nodes")["nodes"]
    assert p["node"]["module"] == "fc1" or nodes[-1]["param"].startswith("fc1.")
    # no node before it belonged to fc1: it is the first of the module to run
    assert all(n["module"] != "fc1" and not (n["param"] or "").startswith("fc1.") for n in nodes[:-1])
    t.finish(srv)
    assert params_hex(t.model) == reference()


def test_nonfinite_pauses_once_at_the_first_bad_gradient(srv: ThreadServer) -> None:
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
    logits = model(x * float("inf"))
    loss = torch.nn.functional.cross_entropy(logits, y)
    g, g_logits = torch.autograd.grad(loss, [model.fc2.weight, logits])
    assert not torch.isfinite(g).all()
    # the paused node's heatmap shows that gradient, its NaNs where torch has them ("NaN" in the JSON)
    here = srv.api(f"/api/runs/nan/paused/nodes/{p['node']['id']}")["node"]
    assert here["name"] == "LogSoftmaxBackward0" and here["thumbs"]
    sent = here["grad_inputs"][0]["thumb"]
    assert "NaN" in sent["values"][0]
    np.testing.assert_array_equal(thumb_values(sent), as_2d(g_logits))
    call(srv, "POST", "/api/runs/nan/resume", {"mode": "continue"})
    wait_for(lambda: not t.thread.is_alive(), what="the end of training")  # once per step: no second pause
    t.finish(srv)
    assert t.breaker.pauses == 1


def test_norm_threshold(srv: ThreadServer) -> None:
    never = Training(srv, "norm-high", [{"on": "norm", "above": 1e9}])
    never.thread.join(60)
    never.finish(srv)
    assert never.breaker.pauses == 0
    t = Training(srv, "norm-low", [{"on": "norm", "above": 0.0}])
    p = wait_for(lambda: paused(srv, "norm-low"), what="the pause")
    assert p["executed"] == 1 and p["step"] == 0  # the loss's node already sends a non-zero gradient
    call(srv, "POST", "/api/runs/norm-low/resume", {"mode": "continue"})
    p = t.pause_in(srv, 1)
    assert p["executed"] == 1  # once per step: step 0 did not pause again
    t.finish(srv)
    assert t.breaker.pauses == 2


def test_a_breakpoint_set_during_a_carried_forward_pauses_from_the_next_step(srv: ThreadServer) -> None:
    """A step whose forward ran carried (NOTE [Carried forwards]: only the native recorder attributes it) keeps
    its attribution when a breakpoint arrives between its forward and its backward: it is recorded natively,
    says so, and the breakpoint pauses the next step, at a node named with its module and line."""
    model, x, y = build()
    tr = gradscape.Tracer(model, run="mid-step", sink=SocketSink(srv.url, "mid-step", break_grace=5.0))
    br = breaker("mid-step")
    wait_for(lambda: br.link is not None and br.link.connected, what="the link")
    loss = lambda: torch.nn.functional.cross_entropy(model(x), y)  # noqa: E731
    for i in range(3):  # the carry is ready once a step's forward was recorded and matched
        with tr.step(i):
            loss().backward()
    with tr.step(3) as st:
        out = loss()
        assert call(srv, "POST", "/api/runs/mid-step/breakpoints", {"on": "node", "name": "AddmmBackward0"})[0] == 201
        wait_for(lambda: br.armed, what="the breakpoint pushed")
        out.backward()
    assert st is not None and BREAKPOINT_NEXT_STEP in st.meta.get("notes", []), st.meta
    assert st.meta["recorder"] == "native" and {n.module for n in st.nodes if n.name == "AddmmBackward0"} == {
        "fc1", "fc2"}
    done: list[Any] = []
    th = threading.Thread(target=lambda: done.append(_one_step(tr, 4, loss)), daemon=True)
    th.start()
    p = wait_for(lambda: paused(srv, "mid-step"), what="the pause in step 4")
    assert p["step"] == 4 and p["node"]["module"] == "fc2" and p["node"]["source"]
    call(srv, "DELETE", "/api/runs/mid-step/breakpoints")
    call(srv, "POST", "/api/runs/mid-step/resume", {"mode": "continue"})
    th.join(60)
    tr.close(10)
    assert done and done[0].meta["recorder"].startswith("python (a breakpoint is set")


def _one_step(tr: Any, i: int, loss: Any) -> Any:
    with tr.step(i) as st:
        loss().backward()
    return st
