"""Loss triggers replayed (NOTE [Replayed loss triggers] in tracer/record/replay.py): a NaN born in a compiled
model's forward is named (op, module, line) by the trace of the step it happened in, and training is bit for
bit that of a twin trained without gradscape."""

from __future__ import annotations

import copy
import inspect
from contextlib import nullcontext
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradscape

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo's notes; the trigger's own warning


class LogBlock(nn.Module):
    """log of its input's row sums plus 50: finite unless a row sums below -50 (the poisoned batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        scale = torch.log(h.sum(-1, keepdim=True) + 50.0)
        return self.fc(h * scale)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.2)
        self.block = LogBlock()
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.bn(self.block(self.drop(self.inp(x)))))


def data(i: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    return (x * 1000.0 if i == k else x), y


def train(model: Any, params: Any, tr: Any, steps: int, k: int) -> None:
    """SGD steps 1..steps (a non-finite loss skips its optimizer step, as loops guard)."""
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    torch.manual_seed(123)
    for i in range(1, steps + 1):
        x, y = data(i, k)
        with tr.step(i) if tr is not None else nullcontext():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        if torch.isfinite(loss):
            opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_nan_in_a_compiled_forward_is_named_and_training_is_unchanged(compiled: bool) -> None:
    torch.manual_seed(0)
    model = Net()
    twin = copy.deepcopy(model)
    run, twin_run = (torch.compile(model, backend="aot_eager"), torch.compile(twin, backend="aot_eager")) \
        if compiled else (model, twin)
    k = 4
    with gradscape.Tracer(run, every=10 ** 6) as tr:
        train(run, model.parameters(), tr, 6, k)
        rng = torch.get_rng_state()
    train(twin_run, twin.parameters(), None, 6, k)
    assert torch.equal(rng, torch.get_rng_state())  # the same draws, in the same order
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), name
    for b, c in zip(model.buffers(), twin.buffers()):  # BatchNorm's statistics took the NaN: compared as bytes
        assert torch.equal(b.reshape(-1).view(torch.uint8), c.reshape(-1).view(torch.uint8))
    (st,) = tr.steps  # the one step traced: by the trigger, inside its block (which yields None)
    assert st.step == k and st.trigger == "nonfinite"
    assert st.meta["replay"]["forward"] == "replayed"
    assert st.meta.get("compiled") == ("eager" if compiled else None)
    assert not [n for n in st.nodes if n.kind == "compiled"]
    born = st.problems[0]
    assert born.kind == "nonfinite_forward"
    node = st.nodes[born.node]
    line = inspect.getsourcelines(LogBlock.forward)[1] + 1
    assert (node.name, node.module, node.source) == ("LogBackward0", "block", f"test_replay.py:{line}")


def test_why_a_step_is_not_replayed_is_said() -> None:
    torch.manual_seed(0)
    model = Net()
    with gradscape.Tracer(model, every=10 ** 6) as tr:
        for i in (1, 2):
            x, y = data(i, 2)
            with tr.step(i) as st:
                out = model(x)
                loss = F.cross_entropy(out.detach().requires_grad_(), y)  # the model's outputs: not in this loss
                loss.backward()
    assert st is None
    (last,) = tr.steps
    assert last.meta["replay"]["forward"] == "not replayed"
    assert "does not depend" in last.meta["replay"]["why"]


def test_a_model_off_the_cpu_keeps_nothing_for_a_replay() -> None:
    """NOTE [Snapshots on the CPU only]: a model whose parameters are not on the CPU (its loss is read after the
    step, so no trigger replays it) keeps no generator state, buffer copies, arguments or outputs at its calls,
    and a replay asked anyway says why; the same model on the CPU keeps them."""
    from gradscape.tracer.record.replay import ForwardSnapshot, replay

    kept = {}
    for device in ("cpu", "meta"):  # meta: a device that is not the CPU, with no kernels to wait for
        torch.manual_seed(0)
        model = Net().to(device)
        snap = ForwardSnapshot(model)
        snap.install()
        try:
            model(torch.randn(6, 4, device=device))
            model(torch.randn(6, 4, device=device))
            assert snap.calls == 2 and snap.spent > 0
            kept[device] = (snap.elsewhere, snap.state, snap.outputs, snap.args)
            why = replay(None, snap, "Tensor.backward", (torch.ones((), requires_grad=True),), {})
        finally:
            snap.remove()
        if device == "meta":
            assert why is not None and "runs on meta" in why
    elsewhere, state, outputs, args = kept["cpu"]
    assert not elsewhere and state is not None and outputs is not None and len(args) == 1
    assert len(state.buffers) == 3  # BatchNorm's running mean, variance and count
    assert kept["meta"] == (True, None, None, ())


def _spiking_run(model: nn.Module, tr: Any, seen: dict[str, torch.Tensor]) -> None:
    """30 quiet steps, then one whose batch is ×100: a `loss_spike` that replays the model's call; `seen` gets
    each parameter's `.grad` from that step's own backward (training's)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(5)
    for i in range(2, 33):
        x, y = torch.randn(16, 4, generator=g), torch.randn(16, 3, generator=g)
        if i == 32:
            x, y = x * 100, y * 100
        with tr.step(i):
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            if i == 32:
                seen.update({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("hooked", [False, True])
def test_the_replay_runs_the_call_as_training_did(hooked: bool) -> None:
    """NOTE [Snapshot by forward]: a model is kept by its forward wrapped while the block is open (its signature
    still its own, nothing left after); one with forward hooks of its own that change its argument and its
    output is kept by hooks, so the replay's call runs them once, as training's did. Either way each
    parameter's gradient in the replayed trace is the one training's backward gave that step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    if hooked:
        model.register_forward_pre_hook(lambda m, args: (args[0] * 2.0,))
        model.register_forward_hook(lambda m, args, out: out + 1.0)
    own = inspect.signature(model.forward)
    seen: dict[str, torch.Tensor] = {}
    # every step full (NOTE [Light steps] in tracer/monitor/light.py): the spike at step 32 replays its own backward
    with gradscape.Tracer(model, every=10 ** 6, tensors="full", norms_every=1) as tr:
        with tr.step(1):  # (step 0 would be traced: no snapshot)
            snap = tr._snapshot
            assert snap.wrapped is not hooked and ("forward" in vars(model)) is not hooked
            assert inspect.signature(model.forward) == own
            twin = copy.deepcopy(model)  # bound to the copy: its calls are not the model's
            model(torch.randn(2, 4))
            twin(torch.randn(2, 4))
            assert snap.calls == 1
        assert "forward" not in vars(model)
        _spiking_run(model, tr, seen)
    (st,) = tr.steps
    assert st.trigger == "loss_spike" and st.meta["replay"]["forward"] == "replayed"
    got = {n.param: n.grad_outputs[0].values for n in st.nodes if n.kind == "param" and n.grad_outputs}
    assert set(got) == set(seen)
    for name, g in seen.items():
        assert torch.equal(torch.from_numpy(got[name]), g), name
