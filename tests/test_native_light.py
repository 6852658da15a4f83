"""The native light step (NOTE [Native light steps] in tracer/monitor/light_native.py) keeps the rows a Python light
step keeps: the same loop run with each gives the same history, bitwise, whatever the block could not read itself
(a loss under a torch-function mode, `torch.autograd.backward` and `grad`, a loss that is not a scalar, a float16
loss, a learning rate that became a tensor), and each loss is the one the loop computed."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

import gradscape
from gradscape.tracer.monitor import light_native
from gradscape.tracer.monitor.monitor import Monitor
from gradscape.tracer.record import native, patched_calls

pytestmark = pytest.mark.skipif(native.extension() is None, reason="the native recorder is not built")


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _loop(i: int, model: nn.Module, opt: torch.optim.Optimizer, losses: dict[int, list[float]]) -> None:
    """Step `i`: most steps one `loss.backward()`; some what the block hands to its Python side."""
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
    loss = (model(x) - y).pow(2).mean()
    seen = [loss]
    if i > 35:  # (steps 36 on: one `loss.backward()` each, opened by the block's fast path between full steps)
        loss.backward()
    elif i % 7 == 3:  # two losses: the second through torch.autograd.backward
        loss.backward(retain_graph=True)
        other = model(x).abs().mean()
        torch.autograd.backward([other])
        seen.append(other)
    elif i % 7 == 4:  # under a torch-function mode of the loop's
        with _PassThrough():
            loss.backward()
    elif i % 7 == 5:  # torch.autograd.grad, then a backward of a float64 loss
        torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
        double = loss.double()
        double.backward()
        seen.append(double)
    elif i % 7 == 6:  # not a scalar: read as None
        out = model(x)
        out.backward(torch.ones_like(out))
        seen = [out]
    else:
        loss.backward()
    if i == 62:  # a learning rate set as a tensor: read one by one from here on
        opt.param_groups[0]["lr"] = torch.tensor(0.01)
    opt.step()
    opt.zero_grad()
    losses[i] = [t.item() if t.numel() == 1 else None for t in seen]


def _history(native_on: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], dict[int, list[float]],
                                                                        dict[str, int]]:
    monkeypatch.setattr(light_native, "ENABLED", native_on)
    asked = [0]  # steps the monitor decided (the native block's fast path opens the others: Tracer.step alone)
    decide = Monitor.step

    def counted(self: Monitor, *args: Any) -> Any:
        asked[0] += 1
        return decide(self, *args)

    monkeypatch.setattr(Monitor, "step", counted)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses: dict[int, list[float]] = {}
    kinds: dict[str, int] = {}
    with gradscape.Tracer(model, every=10 ** 6, norms_every=10) as tr:
        for i in range(1, 71):
            ctx = tr.step(i)
            kinds[type(ctx).__name__] = kinds.get(type(ctx).__name__, 0) + 1
            with ctx:
                _loop(i, model, opt, losses)
        assert not tr._active and not patched_calls._captures and not patched_calls._handling
        rows = tr.history
        tr._monitor.sync_fast()
        assert tr._monitor.sampler.steps == 70  # (each step counted, whichever path opened it)
    kinds["asked"] = asked[0]
    return rows, losses, kinds


def test_the_native_light_step_keeps_the_rows_a_python_one_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    rows, losses, kinds = _history(True, monkeypatch)
    want, want_losses, python_kinds = _history(False, monkeypatch)
    assert kinds.get("LightBlock", 0) > 40 and "LightBlock" not in python_kinds
    assert python_kinds["asked"] == 70 and kinds["asked"] <= 50  # (the fast path opened the others)
    assert losses == want_losses  # (the same loop: the same numbers)
    assert [r["step"] for r in rows] == list(range(1, 71))
    for r in rows:
        assert r["losses"] == losses[r["step"]], r["step"]  # bitwise: what the loop computed
    assert rows == want
    assert rows[65]["lr"] == {"SGD": [pytest.approx(0.01)]} and rows[50]["lr"] == {"SGD": [0.05]}


def test_the_front_of_backward_reads_as_the_function_it_stands_for() -> None:
    """While the wrappers are in place `Tensor.backward` is the extension's front: it binds as a method and names,
    documents and unwraps to the function behind it (`help`, `inspect.signature`)."""
    import inspect

    model = nn.Linear(4, 1)
    with gradscape.Tracer(model, every=10 ** 6) as tr:
        with tr.step(1):
            model(torch.ones(2, 4)).sum().backward()
        front = torch.Tensor.backward
        original = patched_calls.original_of(front)
        assert type(front).__name__ == "BackwardFront" and front is not original
        assert (front.__name__, front.__qualname__, front.__doc__, front.__module__) == (
            original.__name__, original.__qualname__, original.__doc__, original.__module__)
        assert inspect.signature(front) == inspect.signature(original)
        loss = model(torch.ones(2, 4)).sum()
        assert loss.backward.__self__ is loss  # (bound as a method)


def _first_steps(tr: gradscape.Tracer, model: nn.Module) -> None:
    """Steps 1-3 (the first light step puts the backward wrappers in place; the native block opens after)."""
    for i in range(1, 4):
        with tr.step(i):
            model(torch.ones(2, 4)).sum().backward()


def test_an_exception_inside_the_native_block_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(light_native, "ENABLED", True)
    model = nn.Linear(4, 1)
    with gradscape.Tracer(model, every=10 ** 6, norms_every=1000) as tr:
        _first_steps(tr, model)
        ctx = tr.step(4)
        assert type(ctx).__name__ == "LightBlock"
        with pytest.raises(KeyError, match="the loop's"), ctx:
            assert tr._active and patched_calls._captures
            model(torch.ones(2, 4)).sum().backward()
            raise KeyError("the loop's")
        assert not tr._active and not patched_calls._captures and not patched_calls._handling
        with tr.step(5):
            model(torch.ones(2, 4)).sum().backward()
        assert [r["step"] for r in tr.history] == [1, 2, 3, 4, 5]


def test_a_loss_whose_backward_fails_is_read_and_the_error_reaches_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(light_native, "ENABLED", True)
    model = nn.Linear(4, 1)
    with gradscape.Tracer(model, every=10 ** 6, norms_every=1000) as tr:
        _first_steps(tr, model)
        with tr.step(4):
            loss = model(torch.ones(2, 4)).sum()
            loss.backward()
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                loss.backward()  # (the graph was freed: torch's own error, through the block)
            assert not patched_calls._handling
        rows = tr.history
    assert rows[-1]["step"] == 4 and rows[-1]["losses"] == [loss.item(), loss.item()]


def test_a_block_that_cannot_open_lets_go_of_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entering fails when the owner cannot be marked busy (here an object without attributes): the error reaches
    the `with`, and the block is left as closed: nothing on the thread's captures, handed out again."""
    monkeypatch.setattr(light_native, "ENABLED", True)
    model = nn.Linear(4, 1)
    with gradscape.Tracer(model, every=10 ** 6, norms_every=1000) as tr:
        block = tr._monitor.light.native
        ctx = block.open(99, object(), False, 0, 0, 1)
        with pytest.raises(AttributeError), ctx:
            raise AssertionError("the block opened")
        assert not patched_calls._captures
        _first_steps(tr, model)
        with tr.step(4) as got:
            assert got is None and tr._active
        assert [r["step"] for r in tr.history] == [1, 2, 3, 4]


def _scheduled(native_on: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], list[list[float]],
                                                                          dict[int, list[float]]]:
    """A loop whose two parameter groups' learning rates a scheduler moves every step, with a loss spike at step
    140: the history, what the scheduler set before each step, and each loss rule's window at the end."""
    monkeypatch.setattr(light_native, "ENABLED", native_on)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.02}],
                          lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s % 5))  # (the same rates come back)
    rates = []
    g = torch.Generator().manual_seed(1)
    with gradscape.Tracer(model, every=10 ** 6, norms_every=50) as tr:
        for i in range(1, 161):
            rates.append([grp["lr"] for grp in opt.param_groups])
            x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
            with tr.step(i):
                loss = (model(x) - y).pow(2).mean() * (1000.0 if i == 140 else 1.0)
                loss.backward()
                opt.step()
                opt.zero_grad()
            sched.step()
        rows = tr.history
        windows = {pos: list(rule.values) for pos, rule in tr._monitor.triggers.loss_rules.items()}
    return rows, rates, windows


def test_rows_in_a_batch_keep_each_step_s_learning_rates_and_the_rules_their_losses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The native block's rows of a batch each hold the rates their step read (a scheduler moves them every step),
    the rules' windows hold every loss in step order, and the spike at step 140 traces step 141: as the Python
    light step's rows and windows, bitwise."""
    rows, rates, windows = _scheduled(True, monkeypatch)
    want, want_rates, want_windows = _scheduled(False, monkeypatch)
    assert rates == want_rates and [r["step"] for r in rows] == list(range(1, 161))
    for r in rows:
        # (the optimizer is first seen on the first full step, 50: NOTE [Light rows] in light_rows.py)
        assert r["lr"] == ({"SGD": rates[r["step"] - 1]} if r["step"] >= 50 else {}), r["step"]
    assert [r["loss"] for r in rows[60:]] == [r["losses"][0] for r in rows[60:]]
    assert windows[0] == [r["loss"] for r in rows][-100:]  # (the rule's window: every loss, the spike's too)
    assert not rows[139]["norms"] and rows[140]["traced"] and rows[140]["trigger"] == "loss_spike"
    assert [r["step"] for r in rows if r["traced"]] == [141]
    assert rows == want and windows == want_windows
