"""A full or traced step's history row read at once on the host (`host_row` in tracer/monitor/rows.py) against the
same row gathered in `LazyNumbers` and resolved (`pending_row`, then `resolve`: the path a device's numbers take,
which a CPU run no longer takes), on real loops: clipping, two optimizers and three backward calls, GradScaler with
a skipped step, an update written by hand, one optimizer stepping twice."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
from helpers import amp_step

import gradscape
from gradscape.tracer.monitor import monitor as monitor_module
from gradscape.tracer.monitor.rows import host_row, pending_row, resolve


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN, floats bit for bit."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _step_fields(o: Any) -> tuple[Any, ...]:
    return o.optimizer, o.params, o.lr, o.scale, o.skipped, o.grad_norm, o.grad_norm_before_clip


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every host row the monitor makes, checked against the pending path's as it is made."""
    rows: list[dict[str, Any]] = []

    def both(cap: Any, n_params: int, names: list[str]) -> Any:
        got = host_row(cap, n_params, names)
        assert got is not None  # (on the CPU every number is on the host)
        wire, steps, losses = resolve(pending_row(cap, n_params, names))
        assert _same(got[0], wire), (got[0], wire)
        assert _same([_step_fields(o) for o in got[1]], [_step_fields(o) for o in steps])
        assert _same(got[2], losses)
        rows.append(got[0])
        return got

    monkeypatch.setattr(monitor_module, "host_row", both)
    return rows


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def _run(model: nn.Module, body: Callable[[int], None], steps: int = 6, **opts: Any) -> gradscape.Tracer:
    tr = gradscape.Tracer(model, every=2, norms_every=1, **opts)  # every step full, every other traced
    for i in range(steps):
        with tr.step(i):
            body(i)
    tr.close()
    return tr


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(32, 6, generator=g), torch.randn(32, 3, generator=g)


def test_clipped_steps(compared: list[dict[str, Any]]) -> None:
    model = _mlp(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def body(i: int) -> None:
        x, y = _batch(i)
        (model(x) - y).pow(2).mean().backward()
        if i % 3:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        opt.zero_grad()

    tr = _run(model, body)
    assert len(compared) == 6 and [r["traced"] for r in compared] == [True, False] * 3
    assert all(r["grad_norm_clipped"] is not None for r in compared)
    assert [r["step"] for r in tr.history] == list(range(6))


def test_two_optimizers_three_backward_calls(compared: list[dict[str, Any]]) -> None:
    g_net, d_net = nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Sequential(nn.Linear(8, 1))
    opt_g, opt_d = torch.optim.Adam(g_net.parameters(), 1e-3), torch.optim.Adam(d_net.parameters(), 2e-4)
    bce = nn.functional.binary_cross_entropy_with_logits
    real, noise = torch.randn(16, 8), torch.randn(16, 4)

    def body(i: int) -> None:
        d_net.zero_grad()
        bce(d_net(real), torch.ones(16, 1)).backward()
        fake = g_net(noise)
        bce(d_net(fake.detach()), torch.zeros(16, 1)).backward()
        opt_d.step()
        g_net.zero_grad()
        bce(d_net(fake), torch.ones(16, 1)).backward()
        opt_g.step()

    _run(nn.ModuleDict({"G": g_net, "D": d_net}), body)
    assert len(compared) == 6 and all(len(r["losses"]) == 3 and len(r["lr"]) == 2 for r in compared)


def test_gradscaler_with_a_skipped_step(compared: list[dict[str, Any]]) -> None:
    model = _mlp(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 20)  # fp16 overflows at first: skipped steps

    _run(model, lambda i: amp_step(model, opt, scaler, *_batch(i)), steps=8)
    assert compared[0]["skipped"] and compared[0]["scale"] == 2.0 ** 20
    assert not compared[-1]["skipped"] and compared[-1]["scale"] is not None


def test_an_update_by_hand_and_an_optimizer_stepping_twice(compared: list[dict[str, Any]]) -> None:
    model = _mlp(2)
    opt = torch.optim.SGD(model[0].parameters(), lr=0.01)

    def body(i: int) -> None:
        for k in range(2):  # the first layer's optimizer steps twice in the block
            x, y = _batch(10 * i + k)
            (model(x) - y).pow(2).mean().backward()
            opt.step()
        torch.nn.utils.clip_grad_norm_(model[2].parameters(), 0.1)
        with torch.no_grad():  # the last layer updated by hand
            for p in model[2].parameters():
                p.add_(p.grad, alpha=-0.1)
        model.zero_grad()

    _run(model, body)
    assert len(compared) == 6 and all(len(r["losses"]) == 2 for r in compared)
