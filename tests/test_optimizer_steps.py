"""Gradients as each optimizer really stepped with them (`st.params`, `st.optimizer_steps`), checked
against what the optimizer itself saw in a step pre- or post-hook of the test's own, and against
`clip_grad_norm_`'s return value; under GradScaler (fp16 autocast on the CPU; a fused optimizer that
unscales in place), with two models and two optimizers in one block, as the DCGAN example does it, and
with a closure that runs the forward, backward and clipping inside `optimizer.step` (SGD, LBFGS)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import DEVICES, amp_step

import gradscape


def _seen_by(opt: torch.optim.Optimizer, names: dict[nn.Parameter, str]) -> tuple[dict[str, torch.Tensor], object]:
    """What `opt` steps with, read in its own step pre-hook (the test's, not the tracer's)."""
    seen: dict[str, torch.Tensor] = {}

    def pre(o: object, args: object, kwargs: object) -> None:
        for g in opt.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    seen[names[p]] = p.grad.detach().clone()

    return seen, opt.register_step_pre_hook(pre)


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def test_clip_grad_norm_before_and_after() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    names = {p: n for n, p in model.named_parameters()}
    seen, handle = _seen_by(opt, names)
    tr = gradscape.Tracer(model, tensors="full")
    x, y = torch.randn(32, 6) * 10, torch.randn(32, 3)
    with tr.step(0) as st:
        (model(x) - y).pow(2).mean().backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
    handle.remove()
    assert st is not None and len(st.optimizer_steps) == 1
    rec = st.optimizer_steps[0]
    assert rec.optimizer == "SGD" and rec.params == list(names.values()) and rec.lr == [0.1]
    assert float(total) > 0.5  # the loop did clip
    assert rec.grad_norm_before_clip == float(total)  # bitwise: the same computation as clip_grad_norm_
    assert rec.grad_norm == pytest.approx(0.5, rel=1e-5)
    assert rec.scale is None and rec.skipped is False
    for name, g in seen.items():  # the clipped gradients, as the optimizer stepped with them
        assert st.params[name].values is not None
        assert np.array_equal(st.params[name].values, g.numpy()), name
    row = tr.history[-1]
    assert row["grad_norm"] == pytest.approx(float(total), rel=1e-6)
    assert row["grad_norm_clipped"] == pytest.approx(0.5, rel=1e-5)
    assert row["lr"] == {"SGD": [0.1]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_summary_mode_params_are_the_clipped_gradients_in_every_float_dtype(dtype: torch.dtype) -> None:
    """In summary mode the native recorder summarises what each optimizer stepped with (one call into the
    extension): statistics and thumbnail are those of the clipped gradient, not of what arrived."""
    model = _mlp().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    names = {p: n for n, p in model.named_parameters()}
    seen, handle = _seen_by(opt, names)
    tr = gradscape.Tracer(model, monitor=True)
    x, y = torch.randn(32, 6, dtype=dtype) * 10, torch.randn(32, 3, dtype=dtype)
    for i in range(2):
        with tr.step(i) as st:
            (model(x) - y).pow(2).mean().backward()
            arrived = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            opt.step()
            opt.zero_grad()
    handle.remove()
    assert st is not None and st.meta.get("recorder") == "native"
    assert set(st.params) == set(seen) == set(names.values())
    for name, g in seen.items():
        t, want = st.params[name], g.double()
        assert not torch.equal(g, arrived[name])  # the loop did clip
        assert t.dtype == str(dtype).replace("torch.", "") and t.shape == tuple(g.shape)
        assert t.stats["norm"] == pytest.approx(torch.linalg.vector_norm(want).item(), rel=1e-6)
        assert (t.stats["min"], t.stats["max"]) == (want.min().item(), want.max().item())
        # float32 partial sums in the kernel: the mean to within float32's rounding of the values it adds
        assert t.stats["mean"] == pytest.approx(want.mean().item(), rel=1e-5, abs=1e-6 * want.abs().max().item())
        # its thumbnail is every value, to bfloat16's precision (NOTE [Arena thumbnails])
        picture = g.float().bfloat16().float().numpy()
        assert t.thumb is not None and np.array_equal(t.thumb.reshape(g.shape), picture), name


def test_two_models_two_optimizers_one_block_as_dcgan() -> None:
    """netD steps, then the generator's backward adds to netD's .grad: netD's record must still be
    what optimizerD stepped with."""
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6))
    netD = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3)
    names = {p: f"G.{n}" for n, p in netG.named_parameters()} | {p: f"D.{n}" for n, p in netD.named_parameters()}
    seenD, hD = _seen_by(optD, names)
    seenG, hG = _seen_by(optG, names)
    tr = gradscape.Tracer({"G": netG, "D": netD}, tensors="full")
    crit = nn.BCEWithLogitsLoss()
    real = torch.randn(16, 6)
    with tr.step(0) as st:
        netD.zero_grad()
        errD_real = crit(netD(real), torch.ones(16, 1))
        errD_real.backward()
        fake = netG(torch.randn(16, 4))
        errD_fake = crit(netD(fake.detach()), torch.zeros(16, 1))
        errD_fake.backward()
        optD.step()
        netG.zero_grad()
        errG = crit(netD(fake), torch.ones(16, 1))
        errG.backward()  # adds to netD's .grad after optD stepped
        optG.step()
    hD.remove()
    hG.remove()
    assert st is not None
    assert [r.optimizer for r in st.optimizer_steps] == ["Adam", "Adam#1"]
    assert set(st.optimizer_steps[0].params) == set(seenD) and set(st.optimizer_steps[1].params) == set(seenG)
    assert all(n.startswith("D.") for n in seenD) and all(n.startswith("G.") for n in seenG)
    for name, g in {**seenD, **seenG}.items():
        assert np.array_equal(st.params[name].values, g.numpy()), name
    d_now = dict(netD.named_parameters())["0.weight"].grad
    assert not torch.equal(d_now, seenD["D.0.weight"])  # the generator's backward did change it afterwards
    assert st.optimizer_steps[0].lr == [2e-4] and st.optimizer_steps[1].lr == [1e-3]
    assert [r["losses"] for r in tr.history][0] == pytest.approx(
        [float(errD_real.detach()), float(errD_fake.detach()), float(errG.detach())])


def _amp_loop(init_scale: float, steps: int, every: int, tr_opts: dict[str, object] | None = None,  # type: ignore[no-untyped-def]
              device: str = "cpu"):
    model = _mlp(1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    names = {p: n for n, p in model.named_parameters()}
    seen, handle = _seen_by(opt, names)
    scaler = torch.amp.GradScaler(device, init_scale=init_scale)
    tr = gradscape.Tracer(model, every=every, tensors="full", **(tr_opts or {}))
    out = []
    torch.manual_seed(3)
    for i in range(steps):
        x, y = torch.randn(32, 6).to(device), torch.randn(32, 3).to(device)
        seen.clear()
        with tr.step(i + 1) as st:  # from 1: step 0 would be scheduled by any `every`
            amp_step(model, opt, scaler, x, y, device)
        out.append((st, dict(seen), scaler.get_scale()))
    handle.remove()
    return tr, out, names


@pytest.mark.parametrize("device", DEVICES)
def test_gradscaler_skipped_step_is_recorded_and_triggers_the_next(device: str) -> None:
    tr, out, names = _amp_loop(2.0 ** 40, 3, every=1000, device=device)
    rows = tr.history
    assert rows[0]["step"] == 1 and rows[0]["skipped"] and rows[0]["scale"] == 2.0 ** 40  # fp16 overflows at this scale
    assert rows[1]["scale"] == 2.0 ** 39  # GradScaler backed off
    assert rows[0]["trigger"] is None and not rows[0]["traced"]
    st = out[1][0]  # the step after the skipped one is traced, and says why
    assert st is not None and st.trigger == "amp_skipped" and rows[1]["traced"]
    rec = st.optimizer_steps[0]
    assert rec.skipped and rec.scale == 2.0 ** 39 and rec.grad_norm is None
    prob = next(p for p in st.problems if p.kind == "amp_skipped")
    bad = [n for n, v in rows[0]["param_norms"].items() if not math.isfinite(v)]
    assert bad and prob.param == bad[0] and "step 1" in prob.message and all(n in prob.message for n in bad[:8])
    assert out[2][0] is None  # the cooldown: not every skipped step is traced


@pytest.mark.parametrize("device", DEVICES)
def test_gradscaler_params_are_what_the_optimizer_stepped_with(device: str) -> None:
    tr, out, _ = _amp_loop(256.0, 3, every=1, device=device)
    for st, seen, _scale in out:
        assert st is not None
        rec = st.optimizer_steps[0]
        assert not rec.skipped and rec.scale == 256.0 and seen
        for name, g in seen.items():  # unscaled, bitwise what the optimizer used
            assert np.array_equal(st.params[name].values, g.cpu().numpy()), name
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in seen.values()))
        assert rec.grad_norm == pytest.approx(norm, rel=1e-5)
        assert rec.grad_norm_before_clip == pytest.approx(norm, rel=1e-5)  # unscaled, no clipping here


def _used_by(opt: torch.optim.Optimizer, names: dict[nn.Parameter, str]) -> tuple[dict[str, torch.Tensor], object]:
    """What `opt` stepped with, read in its own step post-hook (the test's): with a closure, the forward,
    backward and clipping run inside `step()`, after every pre-hook."""
    used: dict[str, torch.Tensor] = {}

    def post(o: object, args: object, kwargs: object) -> None:
        for g in opt.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    used[names[p]] = p.grad.detach().clone()

    return used, opt.register_step_post_hook(post)


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1),
    lambda ps: torch.optim.LBFGS(ps, lr=0.1, max_iter=1),
], ids=["SGD", "LBFGS"])
def test_a_closure_that_runs_forward_backward_and_clipping_inside_the_step(make: object) -> None:
    """`optimizer.step(closure)` (LBFGS, Lightning's automatic optimization): the gradients are read when
    the step has used them, not in its pre-hook, before the closure made them."""
    model = _mlp()
    opt = make(list(model.parameters()))  # type: ignore[operator]
    names = {p: n for n, p in model.named_parameters()}
    used, handle = _used_by(opt, names)
    tr = gradscape.Tracer(model, tensors="full")
    x, y = torch.randn(32, 6) * 10, torch.randn(32, 3)
    norms: list[float] = []
    losses: list[float] = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
        losses.append(float(loss.detach()))
        return loss

    with tr.step(0) as st:
        opt.step(closure)
    handle.remove()
    assert st is not None and len(norms) == 1 and norms[0] > 0.5
    (rec,) = st.optimizer_steps
    assert rec.grad_norm_before_clip == norms[0]  # bitwise: clip_grad_norm_'s own computation
    assert rec.grad_norm == pytest.approx(0.5, rel=1e-5)
    assert sorted(used) == sorted(st.params)
    for name, g in used.items():
        assert np.array_equal(st.params[name].values, g.numpy()), name  # type: ignore[arg-type]
    assert len(st.passes) == 1  # the tracer saw the backward inside the closure
    row = tr.history[-1]
    assert row["loss"] == losses[0] and row["grad_norm"] == pytest.approx(norms[0], rel=1e-6)


def test_a_fused_optimizer_under_grad_scaler_is_read_unscaled() -> None:
    """A fused optimizer unscales the gradients itself (GradScaler gives it `grad_scale`), in place: what it
    stepped with is the unscaled gradient, and the record keeps the scale."""
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    names = {p: n for n, p in model.named_parameters()}
    used, handle = _used_by(opt, names)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    tr = gradscape.Tracer(model, tensors="full")
    x, y = torch.randn(32, 6), torch.randn(32, 3)
    with tr.step(0) as st:
        scaler.scale((model(x) - y).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
    handle.remove()
    assert st is not None
    (rec,) = st.optimizer_steps
    assert rec.scale == 2.0 ** 10 and not rec.skipped
    expect = math.sqrt(sum(float(g.double().pow(2).sum()) for g in used.values()))
    assert rec.grad_norm == pytest.approx(expect, rel=1e-5)
    for name, g in used.items():
        assert np.array_equal(st.params[name].values, g.numpy()), name  # type: ignore[arg-type]


@pytest.mark.parametrize("change", ["none", "in_place", "through_data", "replaced", "replaced_same_version"])
@pytest.mark.parametrize("monitor_only", [False, True])
def test_the_stepped_norms_follow_any_change_made_to_the_gradients_after_the_backward(
        change: str, monitor_only: bool) -> None:
    """`grad_norm` is what the optimizer stepped with, whatever happened to the gradients after the backward: scaled
    in place, clamped through `.data` (as the DQN tutorial clipped them; no version counter sees that), or
    replaced by a new tensor (also one whose version counter reads what the old one's did)."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    names = {p: n for n, p in model.named_parameters()}
    seen, handle = _seen_by(opt, names)
    tr = gradscape.Tracer(model, every=10 ** 9 if monitor_only else 1)
    x, y = torch.randn(32, 6), torch.randn(32, 3)
    with tr.step(0):
        (model(x) - y).pow(2).mean().backward()
        arrived = [p.grad.detach().clone() for p in model.parameters()]
        if change == "in_place":
            for p in model.parameters():
                p.grad.mul_(3.0)
        elif change == "through_data":
            for p in model.parameters():
                p.grad.data.clamp_(-0.01, 0.01)
        elif change.startswith("replaced"):
            first = next(iter(model.parameters()))
            old = first.grad
            first.grad = None
            del old  # freed: a new tensor may take its address, and starts at version 0 as it did
            first.grad = torch.full_like(first, 2.0)
            if change == "replaced":
                first.grad.add_(1.0)
        opt.step()
        opt.zero_grad()
    handle.remove()
    row = tr.history[-1]
    stepped = [seen[names[p]] for p in model.parameters()]
    before = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in arrived]))
    after = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in stepped]))
    assert row["grad_norm"] == pytest.approx(float(before), rel=1e-6)  # as the backward left them
    assert row["grad_norm_clipped"] == pytest.approx(float(after), rel=1e-6)  # as the optimizer used them
    if change != "none":
        assert abs(float(after) - float(before)) > 1e-3 * float(before)  # the change is one the row must show
