"""What only a GPU shows: an untraced step with the monitor on never makes the host wait for the device,
its numbers are read later and are the optimizer's own; a loss spike on the GPU traces a later step that
names it; CUDA steps stream to a real `gradscape serve`. Skipped where torch sees no CUDA device (CI has
none; bench/cuda.sh runs them on a GPU machine). The gradients themselves are checked on CUDA by the
device-parametrised tests (helpers.CUDA): test_reference, test_summary, test_optimizer_steps (GradScaler),
test_triggers, test_native_recorder and test_breakpoints."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from earlier_release import step_to_wire
from serving import Server, finish, worker
from test_triggers import SPIKE, _setup, _train

import gradscape
from gradscape.app.api import graph_json

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

BUSY_CYCLES = 2_000_000_000  # torch.cuda._sleep: the GPU spins about a second (at ~2 GHz)


def _host_waited(fn: Callable[[], object]) -> bool:
    """Whether `fn` made the host wait for the GPU. The GPU is kept busy first: if it is still busy when
    `fn` returns, the host did not wait for it."""
    torch.cuda.synchronize()
    torch.cuda._sleep(BUSY_CYCLES)
    fn()
    done = torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return done


def test_an_untraced_monitored_step_does_not_make_the_host_wait() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    names = [n for n, _ in model.named_parameters()]
    seen: list[list[torch.Tensor]] = []  # the gradients each optimizer step used (the test's own hook)
    opt.register_step_pre_hook(lambda o, a, k: seen.append([p.grad.detach().clone() for p in model.parameters()]))
    losses: list[torch.Tensor] = []
    x, y = torch.randn(16, 8, device="cuda"), torch.randn(16, 1, device="cuda")

    def step() -> None:
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())

    tr = gradscape.Tracer(model, every=10 ** 9)  # the monitor only: no step is scheduled for a trace

    def monitored(i: int) -> Callable[[], None]:
        def run() -> None:
            with tr.step(i) as st:
                step()
            assert st is None

        return run

    step()  # first use of each kernel (cuBLAS sets up), outside the checks
    assert _host_waited(lambda: losses[-1].item())  # the check sees a wait
    assert not _host_waited(step)  # the training step itself does not wait
    seen.clear()
    losses.clear()
    monitored(1)()  # first step: the monitor sets up
    for i in range(2, 7):
        assert not _host_waited(monitored(i)), f"monitored step {i} waited for the GPU"
    tr.close()
    rows = {r["step"]: r for r in tr.history}
    assert sorted(rows) == list(range(1, 7)) and not any(r["traced"] for r in rows.values())
    for i in range(2, 7):  # seen[i - 1] and losses[i - 1] are monitored step i's
        grads, row = seen[i - 1], rows[i]
        assert row["loss"] == pytest.approx(float(losses[i - 1]), rel=1e-6)
        for name, g in zip(names, grads):
            assert row["param_norms"][name] == pytest.approx(float(g.double().norm()), rel=1e-5), (i, name)
        total = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
        assert row["grad_norm"] == pytest.approx(total, rel=1e-5), i


def test_a_loss_spike_on_the_gpu_traces_a_later_step_that_names_it() -> None:
    """The GPU's loss is read after its step (reading it sooner would wait for the device), so the
    trace is of a later step, and says which step spiked."""
    model, opt, data = _setup("cuda")
    tr = gradscape.Tracer(model, every=10_000)
    traces = _train(model, opt, data, tr, last=SPIKE + 6)
    tr.close()
    spike = SPIKE + 1  # step numbers start at 1
    assert traces, "no step was traced"
    st = traces[0]
    assert spike < st.step <= spike + 3, [t.step for t in traces]
    assert st.trigger == "loss_spike" and st.meta["trigger"]["step"] == spike
    prob = st.problems[0]
    assert prob.kind == "loss_spike" and f"spiked at step {spike}" in prob.message
    assert f"This trace is of step {st.step}" in prob.message
    assert st.nodes and st.params and all(t.device == "cuda:0" for t in st.params.values())


def test_cuda_steps_stream_to_a_real_server(tmp_path: Path) -> None:
    srv = Server(tmp_path / "store.sqlite").start()
    try:
        ref = tmp_path / "reference.sqlite"
        res = finish(worker(srv.url, "gpu", "--steps", "3", "--model", "cnn", "--device", "cuda", "--file", str(ref)))
        assert res["stats"] == {"sent": 3, "spilled": 0, "dropped": 0, "written": 3}
        for step in range(3):
            mine = step_to_wire(gradscape.load(ref, "gpu", step))
            assert {t["device"] for t in mine["tensors"] if t} == {"cuda:0"}
            got = srv.api(f"/api/runs/gpu/steps/{step}")
            assert got == json.loads(json.dumps(graph_json(mine)))
    finally:
        srv.stop()


def test_a_cuda_model_keeps_no_forward_snapshot() -> None:
    """NOTE [Snapshots on the CPU only]: a monitored CUDA model's calls keep no generator state and copy no buffer
    (its loss is read after the step, so no trigger replays it), and its untraced steps still get their rows."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 8, device="cuda")
    tr = gradscape.Tracer(model, every=10 ** 6)
    snap = tr._snapshot
    assert snap is not None
    for i in range(1, 4):
        with tr.step(i):
            opt.zero_grad()
            out = model(x)
            assert snap.calls == 1 and snap.elsewhere and snap.state is None and snap.args == ()
            out.pow(2).mean().backward()
            opt.step()
    tr.close()
    assert [r["step"] for r in tr.history] == [1, 2, 3] and all(r["loss"] is not None for r in tr.history)


def test_light_steps_on_the_gpu_never_wait_and_read_their_losses_later() -> None:
    """NOTE [Light steps]: a light step's loss stays on the device, is read when its row is resolved, and a NaN
    there traces a later step that names it; the host never waits for the GPU."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 8, device="cuda"), torch.randn(16, 1, device="cuda")
    losses: dict[int, torch.Tensor] = {}
    tr = gradscape.Tracer(model, every=10 ** 9, norms_every=1000)  # every step light

    def monitored(i: int) -> Callable[[], None]:
        def run() -> None:
            with tr.step(i):
                loss = (model(x * (math.nan if i == 5 else 1.0)) - y).pow(2).mean()
                loss.backward()
                if i != 5:
                    opt.step()
                opt.zero_grad()
            losses[i] = loss.detach()

        return run

    monitored(1)()
    for i in range(2, 5):
        assert not _host_waited(monitored(i)), f"light step {i} waited for the GPU"
    for i in range(5, 10):
        monitored(i)()
    traces = tr.steps
    tr.close()
    rows = {r["step"]: r for r in tr.history}
    assert sorted(rows) == list(range(1, 10)) and not any(rows[i]["norms"] for i in range(1, 5))
    for i in range(1, 5):
        assert rows[i]["loss"] == float(losses[i]) and rows[i]["lr"] == {}
    assert math.isnan(rows[5]["loss"])
    (st,) = traces
    assert 5 < st.step <= 8 and st.trigger == "nonfinite" and st.meta["trigger"]["step"] == 5
