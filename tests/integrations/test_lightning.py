"""`gradscape.integrations.lightning.GradscapeCallback` in a real `Trainer.fit` on CPU: automatic and
manual optimization, gradient accumulation, mixed precision, clipping, a step that raises. What the
optimizer stepped with is recorded by the test's own hook (gradcheck.UsedGradients)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gradcheck import UsedGradients, accumulated, clipped, total_norm
from torch.utils.data import DataLoader, TensorDataset

import gradscape

pl = pytest.importorskip("lightning.pytorch")
from gradscape.integrations.lightning import GradscapeCallback  # noqa: E402

pytestmark = [
    # Lightning's own notices about a small CPU run, and its use of a torch API that torch deprecates
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*isinstance\\(treespec, LeafSpec\\).*"),
    pytest.mark.filterwarnings("ignore:.*smaller than the logging interval.*"),
]


class Classifier(pl.LightningModule):
    """A small classifier; `raise_at` makes `training_step` raise on that batch, after its forward."""

    def __init__(self, raise_at: int | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        self.raise_at = raise_at
        self.opt: torch.optim.Optimizer | None = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        if batch_idx == self.raise_at:
            raise RuntimeError("boom in training_step")
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        self.opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return self.opt

    def on_fit_start(self) -> None:
        assert self.opt is not None
        self.used = UsedGradients(self.named_parameters(), self.opt)


class TwoOptimizers(pl.LightningModule):
    """Manual optimization with a generator and a discriminator, as in Lightning's GAN example."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
        self.discriminator = torch.nn.Linear(3, 1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        real, noise = batch
        g_opt, d_opt = self.optimizers()
        self.toggle_optimizer(g_opt)
        fake = self.generator(noise)
        g_loss = F.softplus(-self.discriminator(fake)).mean()
        self.manual_backward(g_loss)
        g_opt.step()
        g_opt.zero_grad()
        self.untoggle_optimizer(g_opt)
        self.toggle_optimizer(d_opt)
        d_loss = F.softplus(-self.discriminator(real)).mean() + F.softplus(self.discriminator(fake.detach())).mean()
        self.manual_backward(d_loss)
        d_opt.step()
        d_opt.zero_grad()
        self.untoggle_optimizer(d_opt)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        self.opts = [torch.optim.SGD(self.generator.parameters(), lr=0.1),
                     torch.optim.SGD(self.discriminator.parameters(), lr=0.1)]
        return self.opts

    def on_fit_start(self) -> None:
        self.used = UsedGradients(self.named_parameters(), *self.opts)


def _loader(batches: int, batch_size: int = 4, gan: bool = False) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    n = batches * batch_size
    data = (torch.randn(n, 3, generator=g), torch.randn(n, 4, generator=g)) if gan else \
        (torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g))
    return DataLoader(TensorDataset(*data), batch_size=batch_size)


def _fit(module: pl.LightningModule, callback: GradscapeCallback, loader: DataLoader, **trainer_args: Any) -> None:
    torch.manual_seed(0)
    args: dict[str, Any] = dict(max_epochs=1, accelerator="cpu", devices=1, enable_progress_bar=False, logger=False,
                                enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0)
    args.update(trainer_args)
    pl.Trainer(callbacks=[callback], **args).fit(module, loader)


def _names(module: torch.nn.Module) -> list[str]:
    return [n for n, _ in module.named_parameters()]


def _traced(callback: GradscapeCallback) -> list[gradscape.StepTrace]:
    assert callback.tracer is not None
    return list(callback.tracer.steps)


def test_automatic_optimization_traces_every_nth_optimizer_step_into_the_store(tmp_path: Path) -> None:
    path = tmp_path / "fit.sqlite"
    cb = GradscapeCallback(sink=str(path), every=2, run="fit", tensors="full", keep=10)
    model = Classifier()
    _fit(model, cb, _loader(8), max_steps=5)
    with gradscape.TraceStore(path, readonly=True) as store:
        assert [s["step"] for s in store.steps("fit")] == [0, 2, 4]
        assert all(s["error"] is None for s in store.steps("fit"))
        stored = store.read_step("fit", 2)
    assert sorted(stored.params) == sorted(_names(model))
    steps = _traced(cb)
    assert [st.step for st in steps] == [0, 2, 4]
    assert len(model.used.steps) == 5
    # every window adds one history row, traced or not (the monitor), in memory and in the store
    assert cb.tracer is not None
    assert [(r["step"], r["traced"]) for r in cb.tracer.history] == [(i, i % 2 == 0) for i in range(5)]
    with gradscape.TraceStore(path, readonly=True) as store:
        assert [(r["step"], r["traced"]) for r in store.history("fit")] == [(i, i % 2 == 0) for i in range(5)]
    for (_, used_k), row in zip(model.used.steps, cb.tracer.history):
        assert row["grad_norm_clipped"] == pytest.approx(total_norm(used_k), rel=1e-5)
        assert row["loss"] is not None and np.isfinite(row["loss"])
    for st in steps:
        assert len(st.passes) == 1
        assert sorted(n.param for n in st.nodes if n.param) == sorted(_names(model))  # as in the LightningModule
        assert {"net.0", "net.2"} <= set(st.modules)
        _, used = model.used.steps[st.step]
        for name, grad in used.items():
            assert np.array_equal(st.params[name].values, grad), (st.step, name)  # type: ignore[arg-type]


def test_accumulation_and_clipping_one_step_holds_every_micro_batch(tmp_path: Path) -> None:
    """7 batches with accumulate_grad_batches=3: steps of 3, 3 and 1 micro-batches (Lightning steps on
    an epoch's last batch). The passes' arrivals add up to the gradient before clipping, and clipping that
    gives what the optimizer stepped with, which is what `st.params` holds (Lightning clips inside
    `optimizer.step(closure)`, after its pre-hooks)."""
    cb = GradscapeCallback(every=1, tensors="full", keep=10)
    model = Classifier()
    clip = 0.05
    _fit(model, cb, _loader(7), accumulate_grad_batches=3, gradient_clip_val=clip)
    steps = _traced(cb)
    assert [st.step for st in steps] == [0, 1, 2]
    assert [len(st.passes) for st in steps] == [3, 3, 1]
    assert len(model.used.steps) == 3
    names = _names(model)
    for st in steps:
        before = {name: accumulated(st, name) for name in names}
        assert total_norm(before) > 2 * clip  # the clipping did something
        _, used = model.used.steps[st.step]
        assert total_norm(used) == pytest.approx(clip, rel=1e-4)
        expect = clipped(before, names, clip)
        for name in names:
            np.testing.assert_allclose(used[name], expect[name], rtol=1e-6, atol=0)
            assert np.array_equal(st.params[name].values, used[name]), name  # type: ignore[arg-type]
        (o,) = st.optimizer_steps
        assert o.grad_norm_before_clip == pytest.approx(total_norm(before), rel=1e-5)
        assert o.grad_norm == pytest.approx(total_norm(used), rel=1e-5)


def test_bf16_mixed_precision_with_accumulation() -> None:
    cb = GradscapeCallback(every=1, tensors="full", keep=10)
    model = Classifier()
    _fit(model, cb, _loader(4), accumulate_grad_batches=2, precision="bf16-mixed")
    steps = _traced(cb)
    assert [len(st.passes) for st in steps] == [2, 2]
    for st in steps:
        assert any(n.name == "ToCopyBackward0" for n in st.nodes)  # autocast's casts are in the graph
        assert any(t is not None and t.dtype == "bfloat16" for n in st.nodes for t in n.grad_outputs or ())
        _, used = model.used.steps[st.step]
        for name in _names(model):
            assert np.array_equal(accumulated(st, name), used[name]), name
            assert np.array_equal(st.params[name].values, used[name]), name  # type: ignore[arg-type]


def test_16_mixed_precision_with_a_grad_scaler_on_cpu() -> None:
    """`precision="16-mixed"` with Lightning's MixedPrecision plugin and a GradScaler on CPU: the backward
    passes carry the scaled gradient, the optimizer steps with it unscaled (Lightning unscales before
    `on_before_optimizer_step`)."""
    from lightning.pytorch.plugins import MixedPrecision

    scale = 2.0 ** 8
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    cb = GradscapeCallback(every=1, tensors="full", keep=10)
    model = Classifier()
    _fit(model, cb, _loader(4), accumulate_grad_batches=2, plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    assert scaler.get_scale() == scale  # no step was skipped, so the scale never changed
    steps = _traced(cb)
    assert [len(st.passes) for st in steps] == [2, 2]
    assert len(model.used.steps) == 2
    for st in steps:
        assert any(t is not None and t.dtype == "float16" for n in st.nodes for t in n.grad_outputs or ())
        _, used = model.used.steps[st.step]
        for name in _names(model):
            assert np.array_equal(accumulated(st, name) / np.float32(scale), used[name]), name
            assert np.array_equal(st.params[name].values, used[name]), name  # type: ignore[arg-type]  # unscaled
        assert [o.scale for o in st.optimizer_steps] == [scale]
        assert not st.optimizer_steps[0].skipped
        assert st.optimizer_steps[0].grad_norm == pytest.approx(total_norm(used), rel=1e-5)


def test_manual_optimization_with_two_optimizers() -> None:
    cb = GradscapeCallback(every=1, tensors="full", keep=10)
    model = TwoOptimizers()
    _fit(model, cb, _loader(3, gan=True))
    steps = _traced(cb)
    assert [st.step for st in steps] == [0, 1, 2]  # one step per training_step
    assert len(model.used.steps) == 6 and [k for k, _ in model.used.steps] == [0, 1] * 3
    generator = [n for n in _names(model) if n.startswith("generator.")]
    discriminator = [n for n in _names(model) if n.startswith("discriminator.")]
    for st in steps:
        assert len(st.passes) == 2
        assert sorted(st.params) == sorted(_names(model))
        (_, g_used), (_, d_used) = model.used.steps[2 * st.step: 2 * st.step + 2]
        assert sorted(g_used) == sorted(generator) and sorted(d_used) == sorted(discriminator)
        for name in generator:
            assert np.array_equal(st.params[name].values, g_used[name]), name  # type: ignore[arg-type]
        for name in discriminator:
            assert np.array_equal(st.params[name].values, d_used[name]), name  # type: ignore[arg-type]
        # two optimizer steps, in the order they ran: the generator's, then the discriminator's
        assert [o.optimizer for o in st.optimizer_steps] == ["SGD", "SGD#1"]
        assert [sorted(o.params) for o in st.optimizer_steps] == [sorted(generator), sorted(discriminator)]
        assert [o.grad_norm for o in st.optimizer_steps] == pytest.approx([total_norm(g_used), total_norm(d_used)],
                                                                         rel=1e-5)


def test_a_step_that_raises_is_stored_with_its_error_and_leaves_no_hook(tmp_path: Path) -> None:
    path = tmp_path / "fit.sqlite"
    cb = GradscapeCallback(sink=str(path), run="boom", every=1)
    with pytest.raises(RuntimeError, match="boom in training_step"):
        _fit(Classifier(raise_at=1), cb, _loader(4))
    with gradscape.TraceStore(path, readonly=True) as store:
        rows = store.steps("boom")
    assert [(r["step"], r["error"]) for r in rows] == [(0, None), (1, "RuntimeError: boom in training_step")]
    assert torch._C._len_torch_function_stack() == 0
    assert not torch.nn.modules.module._global_forward_hooks
    assert not torch.nn.modules.module._global_forward_pre_hooks


def test_tracer_options_are_checked_when_the_callback_is_made() -> None:
    with pytest.raises(TypeError, match=r"unknown tracer option\(s\) \['tensor'\]"):
        GradscapeCallback(tensor="full")
    with pytest.raises(ValueError, match="every must be a positive int"):
        GradscapeCallback(every=0)


class CompiledClassifier(Classifier):
    """`Classifier` whose training step calls `self(x)`: what `torch.compile(module)` compiles under Lightning."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo's notes on what it compiles
def test_a_compiled_lightning_module_is_traced_op_by_op_and_compiled_between(tmp_path: Path) -> None:
    """`trainer.fit(torch.compile(module))` (aot_eager): the traced steps run eagerly (NOTE [Compiled regions on
    a traced step]) with the gradients the optimizer stepped with; the untraced ones ran compiled, once compiled."""
    from torch._dynamo.utils import counters

    model = CompiledClassifier()
    cb = GradscapeCallback(every=2, tensors="full", keep=10)
    frames = counters["frames"]["total"]
    _fit(torch.compile(model, backend="aot_eager"), cb, _loader(8), max_steps=5)  # type: ignore[arg-type]
    assert counters["frames"]["total"] - frames == 1  # compiled once, at the first untraced step
    steps = _traced(cb)
    assert [st.step for st in steps] == [0, 2, 4]
    for st in steps:
        assert st.meta["compiled"] == "eager" and not [n for n in st.nodes if n.kind == "compiled"]
        assert {"net.0", "net.2"} <= set(st.modules)
        _, used = model.used.steps[st.step]
        assert sorted(used) == sorted(st.params) == sorted(_names(model))
        for name, grad in used.items():
            assert np.array_equal(st.params[name].values, grad), (st.step, name)  # type: ignore[arg-type]
