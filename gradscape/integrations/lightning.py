"""`GradscapeCallback` for Lightning's `Trainer` (`pip install 'gradscape[lightning]'`).

    from gradscape.integrations.lightning import GradscapeCallback
    trainer = Trainer(callbacks=[GradscapeCallback(sink="runs/fit.sqlite", every=50)])

One traced step is one optimizer step of `fit`, from the first micro-batch's forward to the optimizer
step and its `zero_grad`, as a plain loop's `with tr.step(i):` block:
- automatic optimization: the step opens at `on_train_batch_start` when none is open and closes at the
  `on_train_batch_end` of the batch whose optimizer step ran (`on_before_optimizer_step` fired), so with
  `accumulate_grad_batches=k` one step holds the k micro-batches' backward passes (fewer for the last
  step of an epoch whose batches do not divide by k). Its index is `trainer.global_step` when it opens.
  Under AMP, gradient clipping or a closure-taking optimizer Lightning runs everything between those two
  hooks, so they all fall inside the step.
- manual optimization: one step is one `training_step`, whatever optimizers it steps (a GAN's two);
  its index is the batch's index over all epochs (`trainer.fit_loop.total_batch_idx`).
Parameters are named as in the LightningModule (`named_parameters()`), also under DDP, whose wrapper
is not the module traced. Under a DDP strategy each rank traces its own steps, under one run name
(`run`, or one that rank 0 picks). The tracer is made when `fit` starts (on each rank, after a
spawning strategy has started its processes) and closed when `fit` ends or raises; `callback.tracer`
is it (`callback.tracer.last`, `callback.tracer.steps`).
"""

from __future__ import annotations

from typing import Any

import gradscape
from gradscape.integrations._window import StepWindow, shared_run_name, tracer_options

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - the message is what a user without the extra sees
    raise ImportError("gradscape.integrations.lightning needs Lightning 2.6 or newer: "
                      "pip install 'gradscape[lightning]'") from exc

__all__ = ["GradscapeCallback"]


class GradscapeCallback(Callback):
    """Trace every `every`-th optimizer step of `Trainer.fit` with a `gradscape.Tracer`.

    `sink`, `every`, `run` and any other keyword (`tensors`, `thumb`, `keep`, ...) are passed to
    `gradscape.Tracer` unchanged; an option it does not take is refused here.
    """

    def __init__(self, sink: Any = None, *, every: int = 1, run: str | None = None, **tracer_options_: Any) -> None:
        super().__init__()
        self._options = tracer_options("GradscapeCallback", sink, every, run, tracer_options_)
        self.tracer: gradscape.Tracer | None = None
        self._window: StepWindow | None = None
        self._stepped = False  # an optimizer step ran in the open step (automatic optimization)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Lightning's hook: makes the `Tracer` for the LightningModule (`callback.tracer`)."""
        self._finish()  # a fit that ended without on_fit_end / on_exception
        options = dict(self._options, run=shared_run_name(self._options["run"]))
        self.tracer = gradscape.Tracer(pl_module, **options)
        self._window = StepWindow(self.tracer)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        """Lightning's hook: opens the step (indexed by `trainer.global_step`, or the batch's index
        over all epochs under manual optimization) unless one is open."""
        window = self._window
        if window is None or window.is_open:
            return
        automatic = pl_module.automatic_optimization
        window.open(trainer.global_step if automatic else trainer.fit_loop.total_batch_idx)
        self._stepped = False

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        """Lightning's hook: notes that the open step's optimizer ran."""
        self._stepped = True

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Lightning's hook: closes the step once its optimizer stepped (every batch under manual
        optimization)."""
        if self._window is not None and (self._stepped or not pl_module.automatic_optimization):
            self._window.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Lightning's hook: the open step is stored with the exception; the tracer is closed."""
        self._finish(exception)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Lightning's hook: closes the open step, if any, and the tracer's sinks."""
        self._finish()

    def _finish(self, error: BaseException | None = None) -> None:
        """Close the open step (with the exception that ended training, if any) and the tracer's sinks."""
        if self._window is not None:
            self._window.close(error)
            self._window = None
        if self.tracer is not None:
            self.tracer.close()
