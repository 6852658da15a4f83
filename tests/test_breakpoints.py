"""Breakpoints, tracer side: what each kind matches, and that nothing waits when none is set. A real
server in this process (werkzeug on a free loopback port), a real socket link, training on a thread
(its backward pauses there while the test drives the JSON API)."""

from __future__ import annotations

import json
import math
import random
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from bp_harness import call, paused, wait_for
from bp_worker import build, params_hex, train
from werkzeug.serving import make_server

import gradscape
from gradscape.app.api import thumb_json
from gradscape.app.data import PageData
from gradscape.app.server import ServerConfig, create_app
from gradscape.app.ui.debugger import OVER_BUDGET, heatmaps
from gradscape.tracer import protocol
from gradscape.tracer.debug.breakpoints import THUMB_BUDGET, THUMB_OVERHEAD, Breaker, breaker, check_breakpoint
from gradscape.tracer.protocol import MAX_PAUSED_THUMB_BYTES, check_paused_nodes
from gradscape.tracer.sinks.socket import SocketSink
from gradscape.tracer.wire import decode_array, encode_array, pack


class _Srv:
    def __init__(self, url: str, page: Any = None) -> None:
        self.url = url
        self.page = page  # what the server's page reads (app/data.py): its paused state included

    def api(self, path: str) -> Any:
        return call(self, "GET", path)[1]


_running: list[Training] = []


@pytest.fixture
def srv(tmp_path: Any) -> Iterator[_Srv]:
    app, sio = create_app(str(tmp_path / "bp.sqlite"), ServerConfig(notify_interval=0.05))
    http = make_server("127.0.0.1", 0, app.server, threaded=True)
    th = threading.Thread(target=http.serve_forever, daemon=True)
    th.start()
    state = app.gradscape_state
    yield _Srv(f"http://127.0.0.1:{http.server_port}", PageData(state.store, state.debug))
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

    def __init__(self, srv: _Srv, run: str, points: list[dict[str, Any]], steps: int = 2,
                 blowup: int | None = None, thumb: int = 64, budget: int | None = None) -> None:
        self.run = run
        self.model, self.x, self.y = build()
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
    logits = model(x * float("inf"))
    loss = torch.nn.functional.cross_entropy(logits, y)
    g, g_logits = torch.autograd.grad(loss, [model.fc2.weight, logits])
    assert not torch.isfinite(g).all()
    # the paused node's heatmap shows that gradient, its NaNs where torch has them ("NaN" in the JSON)
    here = srv.api(f"/api/runs/nan/paused/nodes/{p['node']['id']}")["node"]
    assert here["name"] == "LogSoftmaxBackward0" and here["thumbs"]
    sent = here["grad_inputs"][0]["thumb"]
    assert "NaN" in sent["values"][0]
    np.testing.assert_array_equal(_values(sent), _as_2d(g_logits))
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


# ---------------------------------------------------------------------------- paused heatmaps
# NOTE [Paused heatmaps] in tracer/debug/breakpoints.py: the paused message carries thumbnails; the server
# serves one node's at /api/runs/<run>/paused/nodes/<id>; the page draws them (app/ui/debugger.py).
FC2_LABELS = ["self → fc2.bias", "mat1 → input of fc2", "mat2 → fc2.weight (transposed)"]
WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _values(thumb: dict[str, Any]) -> np.ndarray:
    """A thumbnail as the route answers it, back to numbers (its NaN/±Inf strings included)."""
    rows = [[WORDS[v] if isinstance(v, str) else v for v in row] for row in thumb["values"]]
    return np.array(rows, dtype=np.float64).reshape(thumb["shape"])


def _as_2d(g: torch.Tensor) -> np.ndarray:
    """A gradient of rank ≤ 2 in its thumbnail's view (NOTE [Thumbnail views]): a vector is a 1×n strip."""
    a = g.detach().double().numpy()
    return a.reshape(1, -1) if a.ndim == 1 else a


def _block_means(a: np.ndarray, size: int) -> np.ndarray:
    """The thumbnail rule written out here: along each axis, means of blocks of ceil(n / size)
    consecutive elements (the last block shorter) when n > size."""
    for ax in (0, 1):
        n = a.shape[ax]
        if n > size:
            k = math.ceil(n / size)
            a = np.stack([np.take(a, range(i, min(i + k, n)), axis=ax).mean(axis=ax) for i in range(0, n, k)], axis=ax)
    return a


def _fc2_grads() -> dict[str, torch.Tensor]:
    """What fc2's addmm received and sent in the first step, from torch.autograd.grad: ∂L/∂logits,
    ∂L/∂fc2.bias, ∂L/∂(fc2's input), ∂L/∂fc2.weightᵀ."""
    model, x, y = build()
    h = model.act(model.fc1(x))
    logits = model.fc2(h)
    loss = torch.nn.functional.cross_entropy(logits, y)
    g_logits, g_bias, g_h, g_w = torch.autograd.grad(loss, [logits, model.fc2.bias, h, model.fc2.weight])
    return {"out": g_logits, "bias": g_bias, "mat1": g_h, "mat2": g_w.T}


def _thumb_cost(t: dict[str, Any] | None) -> int:
    """Bytes a small gradient's thumbnail costs the budget (small: its thumbnail is every value)."""
    if t is None:
        return 0
    shape = t["shape"]
    cells = math.prod(shape[:-1]) * shape[-1] if len(shape) > 1 else shape[0] if shape else 1
    return 4 * cells + THUMB_OVERHEAD


def _text(component: Any) -> str:
    """Every string in a Dash component tree."""
    if isinstance(component, str):
        return component
    if isinstance(component, (list, tuple)):
        return " ".join(_text(c) for c in component)
    children = getattr(component, "children", None)
    return "" if children is None else _text(children)


def test_paused_node_route_serves_the_gradients(srv: _Srv) -> None:
    t = Training(srv, "heat", [{"on": "node", "name": "AddmmBackward0"}], steps=1)
    p = wait_for(lambda: paused(srv, "heat"), what="the pause")
    nid, k = p["node"]["id"], p["executed"]
    code, doc = call(srv, "GET", f"/api/runs/heat/paused/nodes/{nid}")
    assert code == 200, doc
    node = doc["node"]
    assert doc["paused_at"] == p["node"] and doc["step"] == 0 and doc["executed"] == k
    assert node["id"] == nid and node["order"] == k - 1 and node["thumbs"] and node["runs"] == 1
    assert node["labels"] == FC2_LABELS and node["module"] == "fc2"
    want = _fc2_grads()
    arrived = node["grad_outputs"][0]
    assert arrived["shape"] == [16, 3] and arrived["view"] == "rows 16 × cols 3"
    np.testing.assert_allclose(_values(arrived["thumb"]), _as_2d(want["out"]), rtol=1e-5, atol=1e-8)
    for j, name in enumerate(("bias", "mat1", "mat2")):
        sent = node["grad_inputs"][j]
        assert sent["shape"] == list(want[name].shape)
        np.testing.assert_allclose(_values(sent["thumb"]), _as_2d(want[name]), rtol=1e-5, atol=1e-8)
        assert sent["stats"]["norm"] == pytest.approx(float(want[name].norm()), rel=1e-5)
    # ?order= names one execution; another node, one not run yet, a malformed id
    assert call(srv, "GET", f"/api/runs/heat/paused/nodes/{nid}?order={k - 1}")[1] == doc
    code, err = call(srv, "GET", f"/api/runs/heat/paused/nodes/{nid}?order=0")
    assert code == 404 and "at execution position 0" in err["error"]
    first = srv.api("/api/runs/heat/paused/nodes")["nodes"][0]
    assert call(srv, "GET", f"/api/runs/heat/paused/nodes/{first['id']}")[1]["node"]["name"] == first["name"]
    code, err = call(srv, "GET", "/api/runs/heat/paused/nodes/9999")
    assert code == 404 and "node 9999 has not run in the paused backward of step 0" in err["error"]
    for bad in ("x", "-1", "1.5", "99999999999999999999999"):
        code, err = call(srv, "GET", f"/api/runs/heat/paused/nodes/{bad}")
        assert code == 400 and "node must be an integer" in err["error"], (bad, err)
    assert call(srv, "GET", f"/api/runs/heat/paused/nodes/{nid}?order=x")[0] == 400
    assert call(srv, "POST", f"/api/runs/heat/paused/nodes/{nid}", {})[0] == 405
    assert call(srv, "GET", "/api/runs/nobody/paused/nodes/0")[0] == 404
    # what the page draws for it: the inspector's slot labels, shapes and heatmaps
    shown = heatmaps(srv.page, {"run": "heat", "step": 0, "executed": k, "node": nid, "order": k - 1})
    text = _text(shown)
    for label in FC2_LABELS:
        assert label in text
    assert "grad_outputs[0] · ∂L/∂output · [16×3] float32" in text and "grad_inputs[1] · mat1 → input of fc2" in text
    t.finish(srv)
    assert call(srv, "GET", f"/api/runs/heat/paused/nodes/{nid}")[0] == 409  # resumed
    assert "not paused" in _text(heatmaps(srv.page, {"run": "heat", "node": nid}))
    assert params_hex(t.model) == reference(steps=1)


def test_paused_thumbnails_are_block_means(srv: _Srv) -> None:
    """With `thumb=2` every gradient of fc2's addmm is block-averaged: the thumbnails are the block
    means of torch's own gradients."""
    t = Training(srv, "heat-small", [{"on": "node", "name": "AddmmBackward0"}], steps=1, thumb=2)
    p = wait_for(lambda: paused(srv, "heat-small"), what="the pause")
    node = srv.api(f"/api/runs/heat-small/paused/nodes/{p['node']['id']}")["node"]
    want = _fc2_grads()
    got = [node["grad_outputs"][0]] + node["grad_inputs"]
    for t_, name in zip(got, ("out", "bias", "mat1", "mat2")):
        expect = _block_means(_as_2d(want[name]), 2)
        assert t_["thumb"]["shape"] == list(expect.shape)
        np.testing.assert_allclose(_values(t_["thumb"]), expect, rtol=1e-5, atol=1e-8)
    t.finish(srv)


def test_paused_thumbnails_keep_to_the_budget(srv: _Srv) -> None:
    """Whole nodes, newest first, until the budget: here the two newest of three fit, the oldest keeps
    its statistics and says its heatmap was not sent (so does the page)."""
    shapes = {"NllLossBackward0": [[], [16, 3]], "LogSoftmaxBackward0": [[16, 3], [16, 3]],
              "AddmmBackward0": [[16, 3], [3], [16, 8], [8, 3]]}
    cost = {name: sum(_thumb_cost({"shape": s}) for s in ss) for name, ss in shapes.items()}
    budget = cost["AddmmBackward0"] + cost["LogSoftmaxBackward0"] + cost["NllLossBackward0"] - 1
    t = Training(srv, "heat-budget", [{"on": "node", "name": "AddmmBackward0"}], steps=1, budget=budget)
    p = wait_for(lambda: paused(srv, "heat-budget"), what="the pause")
    nodes = srv.api("/api/runs/heat-budget/paused/nodes")["nodes"]
    assert [n["name"] for n in nodes] == list(shapes) and [n["thumbs"] for n in nodes] == [False, True, True]
    spent = sum(_thumb_cost(x) for n in nodes[1:] for x in n["grad_outputs"] + (n["grad_inputs"] or []))
    assert spent <= budget
    old = srv.api(f"/api/runs/heat-budget/paused/nodes/{nodes[0]['id']}")["node"]
    assert not old["thumbs"] and all(x["thumb"] is None for x in old["grad_outputs"] + old["grad_inputs"] if x)
    # statistics still there: what the loss's node sends on is ∂(mean NLL)/∂log-probabilities, -1/16 at each
    # of the 16 targets, whose norm is 4/16
    assert old["grad_inputs"][0]["stats"]["norm"] == pytest.approx(0.25, rel=1e-6)
    pick = {"run": "heat-budget", "node": nodes[0]["id"], "order": 0}
    assert OVER_BUDGET in _text(heatmaps(srv.page, pick))
    assert OVER_BUDGET not in _text(heatmaps(srv.page, {**pick, "node": p["node"]["id"], "order": 2}))
    t.finish(srv)
    assert params_hex(t.model) == reference(steps=1)


class _Catch:
    """A stand-in for the breakpoint link: keeps what a pause sends and resumes at once."""

    connected = True
    grace = 1.0

    def __init__(self, b: Breaker) -> None:
        self.breaker, self.sent = b, []  # type: ignore[var-annotated]

    def send(self, event: str, payload: dict[str, Any], ack: bool = False) -> dict[str, Any]:
        self.sent.append(payload)
        self.breaker.resume("continue")
        return {"ok": True}


def _caught(run: str, model: torch.nn.Module, points: list[dict[str, Any]], backward: Any) -> list[dict[str, Any]]:
    """The paused messages of one traced step of a real backward (no server: `_Catch` as the link)."""
    b = breaker(run)
    link = _Catch(b)
    b.link = link  # type: ignore[assignment]
    b.set_points(points)
    try:
        tr = gradscape.Tracer(model, run=run)
        with tr.step(0):
            backward()
        tr.close()
    finally:
        b.link = None
        b.set_points([])
    return link.sent


def test_a_deep_backward_sends_a_bounded_pause() -> None:
    """A backward with ~15 MB of thumbnails (100 layers of 256×256) pauses with at most the budget's worth,
    the newest nodes', the paused one among them."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(100):
        layers += [torch.nn.Linear(256, 256), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    x = torch.randn(128, 256)
    sent = _caught("deep", model, [{"on": "module", "name": "0"}], lambda: model(x).square().mean().backward())
    msg = sent[0]  # the first of module 0's nodes to run (each of them pauses)
    nodes = msg["nodes"]
    assert msg["thumb_budget"] == THUMB_BUDGET and len(nodes) > 400
    flags = [n["thumbs"] for n in nodes]
    cut = flags.index(True)
    assert cut > 0 and all(flags[cut:]) and not any(flags[:cut])  # newest first: a suffix, the paused node in it

    def cost(n: dict[str, Any]) -> int:
        return sum(len(x["thumb"]["data"]) + THUMB_OVERHEAD for x in n["grad_outputs"] + (n["grad_inputs"] or [])
                   if x is not None and x["thumb"] is not None)

    spent = sum(cost(n) for n in nodes[cut:])
    assert THUMB_BUDGET // 2 < spent <= THUMB_BUDGET
    assert len(pack(msg)) < THUMB_BUDGET + 1_000_000  # statistics and labels on top: nothing like 15 MB
    # the server takes it as it is
    listing, thumbs = check_paused_nodes(nodes)
    assert len(listing) == len(nodes) and sum(len(a["data"]) for a in thumbs.values()) <= THUMB_BUDGET


def test_nonfinite_thumbnails_survive_to_the_json() -> None:
    """NaN, +Inf and −Inf in a gradient reach the server's JSON as "NaN", "Infinity", "-Infinity", in
    their places: the gradient of (x·w).sum() with respect to x is w."""
    w = torch.tensor([1.5, math.inf, -math.inf, math.nan, -2.0])
    x = torch.ones(5, requires_grad=True)
    sent = _caught("nonfinite-thumbs", torch.nn.Identity(), [{"on": "nonfinite"}], lambda: (x * w).sum().backward())
    assert len(sent) == 1
    node = sent[0]["nodes"][-1]
    assert node["name"] == "MulBackward0" and node["thumbs"]
    a = decode_array(node["grad_inputs"][0]["thumb"])
    np.testing.assert_array_equal(a, w.numpy().reshape(1, 5))  # NaN where NaN (array_equal treats NaNs as equal)
    listing, thumbs = check_paused_nodes(sent[0]["nodes"])
    pos = len(listing) - 1
    assert thumb_json(thumbs[(pos, "grad_inputs", 0)]) == {"shape": [1, 5],
                                                           "values": [[1.5, "Infinity", "-Infinity", "NaN", -2.0]]}
    assert listing[pos]["grad_inputs"][0]["stats"]["nan"] == 1 and listing[pos]["grad_inputs"][0]["stats"]["inf"] == 2


def _payload() -> list[dict[str, Any]]:
    model, x, y = build()
    return _caught("payload", model, [{"on": "node", "name": "AddmmBackward0"}],
                   lambda: torch.nn.functional.cross_entropy(model(x), y).backward())[0]["nodes"]


def test_the_server_checks_the_paused_payload() -> None:
    nodes = _payload()
    listing, thumbs = check_paused_nodes(nodes)
    assert len(thumbs) == 8 and all("thumb" not in t for n in listing for t in n["grad_outputs"] if t)
    thumb = nodes[-1]["grad_outputs"][0]["thumb"]
    bad_thumbs = [
        ({**thumb, "data": thumb["data"][:-1]}, "bytes of data but shape"),
        ({**thumb, "dtype": "|O"}, "dtype '|O' is not one of"),
        ({**thumb, "dtype": "<i8", "data": thumb["data"] * 2}, "a 2-D float array"),
        (encode_array(np.zeros((2, 2, 2), np.float32)), "a 2-D float array"),
        ({**thumb, "data": b"\x80\x04\x95" + b"." * (len(thumb["data"]) - 3), "shape": "x"}, "shape must be a list"),
        ("pickle", "expected a map"),
    ]
    for bad, message in bad_thumbs:
        mutated = [dict(n) for n in nodes]
        mutated[-1]["grad_outputs"] = [{**nodes[-1]["grad_outputs"][0], "thumb": bad}]
        with pytest.raises(protocol.ProtocolError, match=message) as e:
            check_paused_nodes(mutated)
        assert "nodes[2].grad_outputs[0].thumb" in str(e.value)
    for field, value, message in [("id", "x", "nodes[0].id: expected a non-negative int"),
                                  ("order", -1, "nodes[0].order"), ("labels", [1], "nodes[0].labels"),
                                  ("grad_outputs", None, "nodes[0].grad_outputs: expected a list"),
                                  ("name", None, "nodes[0].name")]:
        with pytest.raises(protocol.ProtocolError, match=message.replace(".", r"\.").replace("[", r"\[")):
            check_paused_nodes([{**nodes[0], field: value}] + nodes[1:])
    big = encode_array(np.zeros((1024, 1024), np.float32))
    many = [{**nodes[0], "grad_outputs": [{**nodes[0]["grad_outputs"][0], "thumb": big}]}] * 5
    with pytest.raises(protocol.ProtocolError, match=f"more than {MAX_PAUSED_THUMB_BYTES} bytes"):
        check_paused_nodes(many)


def test_only_protocol_errors_escape_the_check() -> None:
    """Random mutations of a real payload: each is refused with a ProtocolError or accepted as
    something the routes can answer; nothing else."""
    nodes = _payload()
    junk: list[Any] = [None, -1, 2**70, 1.5, math.nan, "", "x" * 300, [], {}, [None], {"a": 1}, True, b"\x00",
                       {"dtype": "<f4", "shape": [1], "data": b"\x00" * 4}]
    rng = random.Random(0)
    for _ in range(400):
        mutated = [dict(n) for n in nodes]
        n = rng.choice(mutated)
        kind = rng.choice(["node", "grad_outputs", "grad_inputs"])
        if kind == "node":
            n[rng.choice(list(n))] = rng.choice(junk)
        elif n.get(kind):
            ts = list(n[kind])
            j = rng.randrange(len(ts))
            if ts[j] is None or rng.random() < 0.2:
                ts[j] = rng.choice(junk)
            else:
                ts[j] = {**ts[j], rng.choice(["shape", "dtype", "stats", "view", "thumb"]): rng.choice(junk)}
            n[kind] = ts
        try:
            listing, thumbs = check_paused_nodes(mutated)
        except protocol.ProtocolError:
            continue
        # what is accepted is served as strict JSON (no NaN, no bytes)
        json.dumps([listing, [thumb_json(a) for a in thumbs.values()]], allow_nan=False)


def test_a_refused_pause_does_not_hold_the_backward(srv: _Srv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A paused message the server refuses (here: thumbnails over a bound lowered for the test) is
    answered with the error; the tracer warns and its backward goes on, since nothing could resume it."""
    monkeypatch.setattr("gradscape.tracer.protocol.paused.MAX_THUMB_ELEMENTS", 2)
    with pytest.warns(RuntimeWarning, match=r"refused the pause at AddmmBackward0: paused\.payload\.nodes\[0\]"):
        t = Training(srv, "refused", [{"on": "node", "name": "AddmmBackward0"}], steps=1)
        t.thread.join(60)
    assert not t.thread.is_alive() and srv.api("/api/runs/refused/paused") == {"paused": False}
    t.finish(srv)
    assert params_hex(t.model) == reference(steps=1)
