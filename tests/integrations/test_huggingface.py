"""`gradscape.integrations.huggingface.GradscapeCallback` in a real `transformers.Trainer.train` on CPU,
on a small GPT-2 made from a config (random weights; nothing is downloaded). What the optimizer stepped
with is recorded by the test's own hook (gradcheck.UsedGradients); the gradient norm before clipping is
the one the Trainer itself logged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gradcheck import UsedGradients, accumulated, clipped, total_norm

import gradscape

transformers = pytest.importorskip("transformers")
from gradscape.integrations.huggingface import GradscapeCallback  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*isinstance\\(treespec, LeafSpec\\).*"),
]


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, each its own label (causal language modelling)."""

    def __init__(self, n: int, length: int = 12, vocab: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _gpt2() -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(config)


def _train(tmp_path: Path, model: Any, callback: GradscapeCallback, samples: int,
           **args: Any) -> tuple[Any, UsedGradients]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    used = UsedGradients(model.named_parameters(), opt)
    targs = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_train_epochs=1, report_to=[],
        use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
        lr_scheduler_type="constant", seed=0, **args)
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=Tokens(samples),
                                   optimizers=(opt, None), callbacks=[callback])
    trainer.train()
    used.remove()
    return trainer, used


def _names(model: torch.nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters()]


def test_accumulation_one_step_holds_k_passes_and_the_clipping_shows(tmp_path: Path) -> None:
    """gradient_accumulation_steps=3 over 8 batches: steps of 3, 3 and 2 micro-batches. What arrived at
    each parameter adds up to the gradient whose norm the Trainer logged (before clipping), and clipping
    that gives what the optimizer stepped with."""
    path = tmp_path / "hf.sqlite"
    clip = 0.05
    model = _gpt2()
    cb = GradscapeCallback(sink=str(path), run="hf", every=1, tensors="full", keep=10)
    trainer, used = _train(tmp_path, model, cb, samples=16, gradient_accumulation_steps=3, max_grad_norm=clip)
    with gradscape.TraceStore(path, readonly=True) as store:
        assert [s["step"] for s in store.steps("hf")] == [0, 1, 2]
    assert cb.tracer is not None
    steps = list(cb.tracer.steps)
    assert [len(st.passes) for st in steps] == [3, 3, 2]
    names = _names(model)  # GPT-2 ties lm_head.weight to transformer.wte.weight: named once, as here
    assert "lm_head.weight" not in names
    logged = [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]
    assert len(logged) == len(used.steps) == 3
    for st, norm, (_, after) in zip(steps, logged, used.steps):
        assert sorted(n.param for n in st.nodes if n.param) == sorted(names)
        before = {name: accumulated(st, name) for name in names}
        assert total_norm(before) == pytest.approx(norm, rel=1e-5)  # the norm the Trainer clipped from
        assert norm > 2 * clip
        expect = clipped(before, names, clip)
        for name in names:
            np.testing.assert_allclose(after[name], expect[name], rtol=1e-5, atol=1e-9)
            assert np.array_equal(st.params[name].values, after[name]), name  # type: ignore[arg-type]
        # the monitor's record of the optimizer step: the norm the Trainer logged, and the clipped one
        (o,) = st.optimizer_steps
        assert o.optimizer == "SGD" and not o.skipped and o.scale is None
        assert o.grad_norm_before_clip == pytest.approx(norm, rel=1e-5)
        assert o.grad_norm == pytest.approx(total_norm(after), rel=1e-5)
        assert o.grad_norm == pytest.approx(clip, rel=1e-4)
    history = cb.tracer.history
    assert [r["step"] for r in history] == [0, 1, 2] and all(r["traced"] for r in history)
    assert [r["grad_norm_clipped"] for r in history] == pytest.approx([clip] * 3, rel=1e-4)


def test_every_nth_step_and_the_gradient_the_optimizer_used(tmp_path: Path) -> None:
    model = _gpt2()
    cb = GradscapeCallback(every=2, tensors="full", keep=10)
    _, used = _train(tmp_path, model, cb, samples=10, max_grad_norm=0.0)
    assert cb.tracer is not None
    steps = list(cb.tracer.steps)
    assert len(used.steps) == 5
    assert [st.step for st in steps] == [0, 2, 4]
    for st in steps:
        assert len(st.passes) == 1
        assert {"transformer.h.0.attn", "transformer.h.1.mlp", "lm_head"} <= set(st.modules)
        _, grads = used.steps[st.step]
        assert sorted(grads) == sorted(st.params) == sorted(_names(model))
        for name, grad in grads.items():
            assert np.array_equal(st.params[name].values, grad), (st.step, name)  # type: ignore[arg-type]
    assert torch._C._len_torch_function_stack() == 0


def test_tracer_options_are_checked_when_the_callback_is_made() -> None:
    with pytest.raises(TypeError, match=r"unknown tracer option\(s\) \['sinks'\]"):
        GradscapeCallback(sinks=[])


class Failing(torch.nn.Module):
    """A language-model-shaped module whose forward raises on its `fail_at`-th call (counting from 0)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 8)
        self.head = torch.nn.Linear(8, 64)
        self.calls, self.fail_at = 0, fail_at

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(self.embed(input_ids))
        self.calls += 1
        if self.calls - 1 == self.fail_at:
            raise RuntimeError("boom in forward")
        return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())}


def test_a_train_that_raises_inside_a_step_is_recorded_once_the_callback_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "hf.sqlite"
    cb = GradscapeCallback(sink=str(path), run="boom", every=1)
    with pytest.raises(RuntimeError, match="boom in forward") as caught:
        _train(tmp_path, Failing(fail_at=1), cb, samples=8)
    # the Trainer told no callback: step 1 is still open, with the tracer's mode and the monitor's wrappers
    originals = (torch.Tensor.backward, torch.autograd.backward)
    assert torch._C._len_torch_function_stack() == 1
    assert all(hasattr(f, "__wrapped__") for f in originals)
    cb.close(caught.value)
    assert not any(hasattr(f, "__wrapped__") for f in (torch.Tensor.backward, torch.autograd.backward))
    with gradscape.TraceStore(path, readonly=True) as store:
        rows = [(r["step"], r["error"]) for r in store.steps("boom")]
    assert rows == [(0, None), (1, "RuntimeError: boom in forward")]
    assert torch._C._len_torch_function_stack() == 0
    assert not torch.nn.modules.module._global_forward_hooks
    from torch.optim import optimizer

    assert not optimizer._global_optimizer_pre_hooks and not optimizer._global_optimizer_post_hooks
    cb.close()  # idempotent


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo's notes on what it compiles
def test_torch_compile_traced_steps_show_every_op_and_untraced_ones_stay_compiled(tmp_path: Path) -> None:
    """`TrainingArguments(torch_compile=True)` (backend aot_eager): the traced steps run eagerly, op by op
    (NOTE [Compiled regions on a traced step]); the model compiles once, on the first untraced step."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    def compiles(callback: Any) -> tuple[int, UsedGradients]:
        """The graphs dynamo compiled during one run (not the frames it looked at: their count depends on what
        ran before in the process, e.g. a `warning_once` that breaks the graph only the first time it warns)."""
        torch._dynamo.reset()  # a fresh cache: each run compiles what it needs
        graphs = counters["stats"]["unique_graphs"]
        _, used = _train(tmp_path, model, callback, samples=10, max_grad_norm=0.0, torch_compile=True,
                         torch_compile_backend="aot_eager")
        return counters["stats"]["unique_graphs"] - graphs, used

    model = _gpt2()
    plain, _ = compiles(transformers.TrainerCallback())  # the same run without gradscape
    model = _gpt2()
    cb = GradscapeCallback(every=2, tensors="full", keep=10)
    traced, used = compiles(cb)
    # untraced steps ran compiled, and gradscape made nothing compile again: this GPT-2 compiled 2 graphs over 5
    # compiled steps without gradscape, and the same 2 over the 2 untraced steps with it (traced ones compile none)
    assert 1 <= traced <= plain
    assert cb.tracer is not None
    steps = list(cb.tracer.steps)
    assert [st.step for st in steps] == [0, 2, 4]
    for st in steps:
        assert st.meta["compiled"] == "eager" and not [n for n in st.nodes if n.kind == "compiled"]
        assert {"transformer.h.0.attn", "transformer.h.1.mlp", "lm_head"} <= set(st.modules)
        _, grads = used.steps[st.step]
        assert sorted(grads) == sorted(st.params) == sorted(_names(model))  # no `_orig_mod.` in any name
        for name, grad in grads.items():
            assert np.array_equal(st.params[name].values, grad), (st.step, name)  # type: ignore[arg-type]
