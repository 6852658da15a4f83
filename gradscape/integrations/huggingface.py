"""`GradscapeCallback` for `transformers.Trainer` (`pip install 'gradscape[huggingface]'`).

    from gradscape.integrations.huggingface import GradscapeCallback
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[GradscapeCallback(sink="runs/hf.sqlite", every=50)])

One traced step is one optimizer step of `train()`: it opens at `on_step_begin` (before the first
micro-batch's forward) and closes at `on_step_end` (after the Trainer's gradient clipping, optimizer
step and `zero_grad`), so with `gradient_accumulation_steps=k` it holds the k micro-batches' backward
passes, and the gradients as the backward left them, before the clipping that the Trainer's own
callbacks only see the result of. Its index is `state.global_step` when it opens. Parameters are named
as in the model given to the Trainer (`named_parameters()`: no `module.` of a DDP wrapper). Under
torch.distributed each rank traces its own steps under one run name: `run`, else the arguments'
`run_name`, else one that rank 0 picks.

The tracer is made at `on_train_begin` and closed at `on_train_end`; `callback.tracer` is it. The
Trainer calls no callback when `train()` raises: a step open then keeps the tracer's hooks until this
callback's next `on_train_begin` or `callback.close(exc)`, which records it with the error.
"""

from __future__ import annotations

from typing import Any

import gradscape
from gradscape.integrations._window import StepWindow, shared_run_name, tracer_options

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:  # pragma: no cover - the message is what a user without the extra sees
    raise ImportError("gradscape.integrations.huggingface needs transformers 5 or newer: "
                      "pip install 'gradscape[huggingface]'") from exc

__all__ = ["GradscapeCallback"]


class GradscapeCallback(TrainerCallback):
    """Trace every `every`-th optimizer step of `transformers.Trainer.train` with a `gradscape.Tracer`.

    `sink`, `every`, `run` and any other keyword (`tensors`, `thumb`, `keep`, ...) are passed to
    `gradscape.Tracer` unchanged; an option it does not take is refused here.
    """

    def __init__(self, sink: Any = None, *, every: int = 1, run: str | None = None, **tracer_options_: Any) -> None:
        self._options = tracer_options("GradscapeCallback", sink, every, run, tracer_options_)
        self.tracer: gradscape.Tracer | None = None
        self._window: StepWindow | None = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, **kwargs: Any) -> None:
        """The Trainer's hook: makes the `Tracer` for the Trainer's model (`callback.tracer`); a step a
        `train()` that raised left open is closed first."""
        self.close()  # a step the last train() left open when it raised
        if model is None:
            raise ValueError("GradscapeCallback: the Trainer passed no model to on_train_begin")
        run = shared_run_name(self._options["run"] or args.run_name)
        self.tracer = gradscape.Tracer(model, **dict(self._options, run=run))
        self._window = StepWindow(self.tracer)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        """The Trainer's hook: opens the step (indexed by `state.global_step`), before its first micro-batch."""
        if self._window is not None:
            self._window.open(state.global_step)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        """The Trainer's hook: closes the step, after the optimizer step and its `zero_grad`."""
        if self._window is not None:
            self._window.close()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        """The Trainer's hook: closes the open step, if any, and the tracer's sinks."""
        self.close()

    def close(self, error: BaseException | None = None) -> None:
        """Close the open step, if any, and the tracer's sinks. Idempotent. A step still open here was left
        by a `train()` that raised: it is recorded with `error` (the exception, when you have it) or with
        an error that says so."""
        if self._window is not None:
            if self._window.is_open and error is None:
                error = RuntimeError("gradscape: train() ended inside this step (it raised?)")
            self._window.close(error)
            self._window = None
        if self.tracer is not None:
            self.tracer.close()
