"""Source lines carried between the steps of a repeated forward (NOTE [Carried forwards] in
gradscape.tracer.record.carry): which steps run without the tracer's function mode, that they get the very
lines and modules a step with the mode gets (checked against this file's lines), that their gradients are
untouched, and the cases that never carry."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.autograd import backward as backward_by_name  # taken before any block: the wrappers never see it

import gradscape
from gradscape.tracer.record.carry import NOT_CARRIED

_mode_stack_len = torch._C._len_torch_function_stack
_ENGINE = torch.autograd._engine_run_backward  # what `backward` calls (NOTE [Backward by name]), before any block


def _line(marker: str) -> str:
    """`test_carried_sources.py:N` of the line of this file that ends with `# marker`."""
    lines = Path(__file__).read_text().splitlines()
    (n,) = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    return f"{Path(__file__).name}:{n}"


class _Swish(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * torch.sigmoid(h)  # @swish (its input goes to two ops: its grad_input is their sum)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.act = _Swish()
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, extra: bool = False) -> torch.Tensor:
        h = torch.tanh(self.fc(x)) * 2  # @fc
        if extra:
            h = h + h.sin()  # @extra
        return self.out(self.act(h))  # @out


def _want() -> list[tuple[str | None, str, str]]:
    fc, out, loss, swish = _line("@fc"), _line("@out"), _line("@loss"), _line("@swish (its input goes to two "
                                                                            "ops: its grad_input is their sum)")
    return sorted([("fc", "AddmmBackward0", fc), ("fc", "TBackward0", fc), ("<root>", "TanhBackward0", fc),
                   ("<root>", "MulBackward0", fc), ("act", "SigmoidBackward0", swish), ("act", "MulBackward0", swish),
                   ("out", "AddmmBackward0", out), ("out", "TBackward0", out),
                   (None, "PowBackward0", loss), (None, "MeanBackward0", loss)], key=repr)


def _ops(st: gradscape.StepTrace) -> list[tuple[str | None, str, str | None]]:
    return sorted(((n.module, n.name, n.source) for n in st.nodes if n.kind == "op"), key=repr)


def _step(tr: gradscape.Tracer, model: nn.Module, x: torch.Tensor, i: int, extra: bool = False,
          by_name: bool = False) -> tuple[gradscape.StepTrace, bool]:
    """One traced step; also whether a function mode was on inside its block."""
    with tr.step(i) as st:
        moded = _mode_stack_len() > 0
        loss = model(x, extra).pow(2).mean()  # @loss
        if by_name:
            backward_by_name(loss)
        else:
            loss.backward()
    assert st is not None
    return st, moded


@pytest.mark.parametrize("monitor", [True, False])
def test_a_repeated_forward_runs_without_the_mode_and_keeps_its_lines_and_gradients(monitor: bool) -> None:
    """With the monitor its capture hands a carried step's backward to the recorder; without it, the traced
    step's own (NOTE [Backward handoff] in tracer/record/handoff.py)."""
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(5, 3)
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # module → (grad_input[0], grad_output[0]), torch's
    hooks = [getattr(model, m).register_full_backward_hook(
        lambda mod, gi, go, m=m: seen.__setitem__(m, (gi[0], go[0]))) for m in ("act", "out")]
    want_grads = torch.autograd.grad(model(x).pow(2).mean(), list(model.parameters()))
    for h in hooks:
        h.remove()
    tr = gradscape.Tracer(model, monitor=monitor)
    moded = []
    for i in range(5):
        st, on = _step(tr, model, x, i)
        moded.append(on)
        assert _ops(st) == _want(), i  # the very lines and modules, with the mode or carried
        assert "notes" not in st.meta, i
        for m, (gi, go) in seen.items():  # module calls, carried too: torch's full backward hook's gradients
            (call,) = st.modules[m].calls
            assert call.grad_input[0].stats["norm"] == pytest.approx(gi.norm().item(), rel=1e-6), (i, m)
            assert call.grad_output[0].stats["norm"] == pytest.approx(go.norm().item(), rel=1e-6), (i, m)
        for (name, p), want in zip(model.named_parameters(), want_grads):
            assert torch.equal(p.grad, want), (i, name)  # the backward handed over by the wrappers: untouched
            assert st.params[name].stats["norm"] == pytest.approx(want.norm().item(), rel=1e-6), (i, name)
            p.grad = None
    assert moded == [True, True, False, False, False]  # two steps with the mode agreed: then carried


def test_a_forward_that_changes_loses_only_its_own_attribution_and_the_mode_comes_back() -> None:
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(5, 3)
    tr = gradscape.Tracer(model)
    moded, steps = [], []
    for i, extra in enumerate([False, False, False, True, False, False, False]):
        st, on = _step(tr, model, x, i, extra)
        moded.append(on)
        steps.append(st)
        model.zero_grad()
    assert moded == [True, True, False, False, True, True, False]
    changed = steps[3]  # ran without the hooks and the mode, and its forward was not the kept one
    assert changed.meta["notes"] == [NOT_CARRIED]
    assert [n for n in changed.nodes if n.source is not None or n.module is not None] == []
    assert all(not m.calls for m in changed.modules.values())
    assert changed.params.keys() == {n for n, _ in model.named_parameters()}  # its gradients are all there
    assert _ops(steps[4]) == _ops(steps[6]) == _want()


@pytest.mark.parametrize("how", ["full tensors", "backward by name", "backward by name, monitor off"])
def test_never_carried(how: str) -> None:
    """A backward taken by name reaches the mode on every release (NOTE [Backward by name] in
    tracer/record/backward_by_name.py: on torch 2.9 through `backward`'s call of the engine, put back as each
    block ends), and the step records it whole: its ops, and each parameter's gradient as torch gives it."""
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(5, 3)
    want = torch.autograd.grad(model(x).pow(2).mean(), list(model.parameters()))
    opts = {"full tensors": {"tensors": "full"}, "backward by name, monitor off": {"monitor": False}}.get(how, {})
    tr = gradscape.Tracer(model, **opts)  # type: ignore[arg-type]
    for i in range(4):
        st, on = _step(tr, model, x, i, by_name=how.startswith("backward by name"))
        assert on, (how, i)
        assert _ops(st) == _want() and len(st.passes) == 1, (how, i)
        assert torch.autograd._engine_run_backward is _ENGINE, (how, i)
        for (name, p), g in zip(model.named_parameters(), want):
            assert torch.equal(p.grad, g), (how, i, name)
            assert st.params[name].stats["norm"] == pytest.approx(g.norm().item(), rel=1e-6), (how, i, name)
        model.zero_grad()


class _Cut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x).detach()  # @detach
        return self.out(h)


def test_a_parameter_without_a_gradient_keeps_the_mode_on_to_name_the_cut() -> None:
    """The `no_grad` problem names the line of the `.detach()` that cut `fc` off, which only the mode sees:
    such a forward is never carried."""
    torch.manual_seed(0)
    model, x = _Cut(), torch.randn(5, 3)
    tr = gradscape.Tracer(model)
    for i in range(4):
        with tr.step(i) as st:
            assert _mode_stack_len() > 0, i
            model(x).sum().backward()
        assert st is not None
        cut = {p.param: p for p in st.problems if p.kind == "no_grad"}
        assert set(cut) == {"fc.weight", "fc.bias"}, i
        assert _line("@detach") in cut["fc.weight"].message, (i, cut["fc.weight"].message)
        model.zero_grad()


def test_a_second_backward_in_a_carried_step_keeps_the_first_ones_attribution() -> None:
    """Steps 0-2 make one backward each (2 is carried); step 3, carried too, makes a second backward from a
    new loss: the first graph's nodes keep the kept lines and modules, the nodes the second one added have
    none, the step says so, and the next step runs with the hooks and the mode."""
    from gradscape.tracer.record.carry import SECOND_PASS

    torch.manual_seed(0)
    model, x = _Net(), torch.randn(5, 3)
    tr = gradscape.Tracer(model)
    moded, size = [], 0
    for i in range(5):
        with tr.step(i) as st:
            moded.append(_mode_stack_len() > 0)
            loss = model(x).pow(2).mean()  # @loss2
            loss.backward(retain_graph=i == 3)
            if i == 3:
                (model.out.weight.sum() * 3).backward()
        assert st is not None
        model.zero_grad()
        if i == 2:
            size = len(st.nodes)  # a one-backward step's graph, walked first in step 3 too
        if i == 3:
            assert st.meta["notes"] == [SECOND_PASS] and len(st.passes) == 2
            want = sorted([(m, name, _line("@loss2") if src == _line("@loss") else src) for m, name, src in _want()],
                          key=repr)
            first = [n for n in st.nodes if n.id < size]
            assert sorted(((n.module, n.name, n.source) for n in first if n.kind == "op"), key=repr) == want
            added = [n for n in st.nodes if n.name in ("SumBackward0",) and n.kind == "op"]
            assert added and all(n.source is None and n.module is None for n in added)
    assert moded == [True, True, False, False, True]


@pytest.mark.parametrize("micro", [2, 8])
def test_gradient_accumulation_is_carried_call_by_call(micro: int) -> None:
    """A step of `micro` backward calls: the first two steps record their forwards with the mode, the rest
    run without it and still get every call's lines and modules, as a recorded step has them, and train
    bit for bit as an untraced twin."""
    torch.manual_seed(0)
    model, twin = _Net(), _Net()
    twin.load_state_dict(model.state_dict())
    xs = [torch.randn(5, 3) for _ in range(micro)]
    opt, opt_twin = torch.optim.SGD(model.parameters(), 0.1), torch.optim.SGD(twin.parameters(), 0.1)
    seen: list[torch.Tensor] = []  # what torch's full backward hook gives as `out`'s grad_input, per call
    model.out.register_full_backward_hook(lambda mod, gi, go: seen.append(gi[0]))
    # `act`'s grad_input, the sum of two ops' gradients (a module sum, marked call by call), from the twin's input
    # to it (a backward hook on the model's `act` would put one node before the two ops: no sum to make)
    into_act: list[torch.Tensor] = []

    def keep_input(mod: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        args[0].retain_grad()
        into_act.append(args[0])
    twin.act.register_forward_pre_hook(keep_input)
    tr = gradscape.Tracer(model)
    moded, steps = [], []
    for i in range(5):
        seen.clear()
        into_act.clear()
        with tr.step(i) as st:
            moded.append(_mode_stack_len() > 0)
            for x in xs:
                (model(x).pow(2).mean() / micro).backward()  # @micro
            opt.step()
            opt.zero_grad()
        for x in xs:
            (twin(x).pow(2).mean() / micro).backward()
        opt_twin.step()
        opt_twin.zero_grad()
        assert st is not None
        steps.append(st)
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            assert torch.equal(p, q), (i, name)
    assert moded == [True, True, False, False, False]
    recorded, carried = steps[1], steps[4]
    assert len(carried.passes) == micro and "notes" not in carried.meta

    def attributed(st: gradscape.StepTrace) -> list[tuple[str | None, str, str | None]]:
        return [(n.module, n.name, n.source) for n in st.nodes]
    assert attributed(carried) == attributed(recorded)
    ops = [n for n in carried.nodes if n.kind == "op"]
    # every call's nodes have their module and line: the last call's as much as the first's
    assert sum(n.source == _line("@micro") for n in ops) == 3 * micro  # PowBackward0, MeanBackward0, DivBackward0
    assert all(n.source is not None for n in ops)
    calls = carried.modules["out"].calls
    assert len(calls) == micro and all(c.grad_input[0] is not None for c in calls)
    for c, want in zip(calls, seen):  # each call's module gradient is torch's for that call
        assert c.grad_input[0].stats["norm"] == pytest.approx(float(want.double().norm()), rel=1e-6)
    acts = carried.modules["act"].calls
    summed = [h.grad for h in into_act]  # (the last step's: the carried one)
    assert len(acts) == micro == len(summed)
    for c, want in zip(acts, summed):  # the module sums of every call, the last's as much as the first's
        assert c.grad_input[0] is not None, "a call's module sum was not marked"
        assert c.grad_input[0].stats["norm"] == pytest.approx(float(want.double().norm()), rel=1e-6)
        assert c.grad_input[0].stats["max"] == pytest.approx(float(want.max()), rel=1e-6)


def test_a_call_that_differs_loses_only_its_own_attribution() -> None:
    """Steps of two backward calls; in a carried step the second call's graph differs (an extra op): the
    nodes the first call walked keep their lines and modules, the second's get none, and the step says so."""
    from gradscape.tracer.record.carry import SECOND_PASS

    torch.manual_seed(0)
    model, x = _Net(), torch.randn(5, 3)
    tr = gradscape.Tracer(model)
    moded = []
    for i in range(5):
        with tr.step(i) as st:
            moded.append(_mode_stack_len() > 0)
            model(x).pow(2).mean().backward()  # @loss3
            model(x, extra=i == 3).pow(2).mean().backward()
        assert st is not None
        model.zero_grad()
        if i == 2:
            first = sum(1 for n in st.nodes if n.kind == "op" and n.source == _line("@loss3"))
        if i == 3:
            assert st.meta["notes"] == [SECOND_PASS] and len(st.passes) == 2
            assert sum(1 for n in st.nodes if n.kind == "op" and n.source == _line("@loss3")) == first
            assert [n for n in st.nodes if n.name == "SinBackward0" and (n.source or n.module)] == []
    assert moded == [True, True, False, False, True]
