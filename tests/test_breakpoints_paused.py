"""Breakpoints, what a pause sends: the paused backward's nodes with heatmap thumbnails of their
gradients (NOTE [Paused heatmaps] in tracer/record/debug/breakpoints.py), kept to a byte budget; the route that
serves one node's thumbnails and what the page draws of them; the server's checks of the payload (one it
refuses does not hold the backward). The server and training on threads as in tests/test_breakpoints.py
(tests/bp_harness.py); some tests pause a backward with no server at all (`_caught`)."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy as np
import pytest
import torch
from bp_harness import ThreadServer, Training, as_2d, call, paused, reference, thumb_values, wait_for
from bp_worker import build, params_hex

import gradscape
from gradscape.app.api import thumb_json
from gradscape.app.ui.debugger import OVER_BUDGET, heatmaps
from gradscape.tracer import protocol
from gradscape.tracer.protocol import MAX_PAUSED_THUMB_BYTES, check_paused_nodes
from gradscape.tracer.record.debug.breakpoints import THUMB_BUDGET, THUMB_OVERHEAD, Breaker, breaker
from gradscape.tracer.wire import decode_array, encode_array, pack

# ---------------------------------------------------------------------------- paused heatmaps
_PICTURE = 2**-8  # a thumbnail's cells are rounded to bfloat16 (NOTE [Arena thumbnails])

# NOTE [Paused heatmaps] in tracer/record/debug/breakpoints.py: the paused message carries thumbnails; the server
# serves one node's at /api/runs/<run>/paused/nodes/<id>; the page draws them (app/ui/debugger.py).
FC2_LABELS = ["self → fc2.bias", "mat1 → input of fc2", "mat2 → fc2.weight (transposed)"]


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


def test_paused_node_route_serves_the_gradients(srv: ThreadServer) -> None:
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
    np.testing.assert_allclose(thumb_values(arrived["thumb"]), as_2d(want["out"]), rtol=_PICTURE, atol=1e-8)
    for j, name in enumerate(("bias", "mat1", "mat2")):
        sent = node["grad_inputs"][j]
        assert sent["shape"] == list(want[name].shape)
        np.testing.assert_allclose(thumb_values(sent["thumb"]), as_2d(want[name]), rtol=_PICTURE, atol=1e-8)
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


def test_paused_thumbnails_are_block_means(srv: ThreadServer) -> None:
    """With `thumb=2` every gradient of fc2's addmm is block-averaged: the thumbnails are the block
    means of torch's own gradients."""
    t = Training(srv, "heat-small", [{"on": "node", "name": "AddmmBackward0"}], steps=1, thumb=2)
    p = wait_for(lambda: paused(srv, "heat-small"), what="the pause")
    node = srv.api(f"/api/runs/heat-small/paused/nodes/{p['node']['id']}")["node"]
    want = _fc2_grads()
    got = [node["grad_outputs"][0]] + node["grad_inputs"]
    for t_, name in zip(got, ("out", "bias", "mat1", "mat2")):
        expect = _block_means(as_2d(want[name]), 2)
        assert t_["thumb"]["shape"] == list(expect.shape)
        np.testing.assert_allclose(thumb_values(t_["thumb"]), expect, rtol=_PICTURE, atol=1e-8)
    t.finish(srv)


def test_paused_thumbnails_keep_to_the_budget(srv: ThreadServer) -> None:
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


def test_a_refused_pause_does_not_hold_the_backward(srv: ThreadServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A paused message the server refuses (here: thumbnails over a bound lowered for the test) is
    answered with the error; the tracer warns and its backward goes on, since nothing could resume it."""
    monkeypatch.setattr("gradscape.tracer.protocol.paused.MAX_THUMB_ELEMENTS", 2)
    with pytest.warns(RuntimeWarning, match=r"refused the pause at AddmmBackward0: paused\.payload\.nodes\[0\]"):
        t = Training(srv, "refused", [{"on": "node", "name": "AddmmBackward0"}], steps=1)
        t.thread.join(60)
    assert not t.thread.is_alive() and srv.api("/api/runs/refused/paused") == {"paused": False}
    t.finish(srv)
    assert params_hex(t.model) == reference(steps=1)
