"""A 2-rank Lightning `Trainer.fit` with `strategy="ddp"` on CPU (gloo), traced by GradscapeCallback into
one trace file; run by tests/integrations/test_lightning_ddp.py as `python lightning_ddp_worker.py OUT`.
Lightning starts rank 1 by running this same command again. Each rank writes OUT/rank<r>.json: what its
trainer wrapped the module in, and the gradients its optimizer stepped with."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from gradscape.integrations.lightning import GradscapeCallback


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        self.used: list[dict[str, list[float]]] = []
        self.wrapper = ""

    def on_fit_start(self) -> None:
        self.wrapper = type(self.trainer.strategy.model).__name__  # what the module runs inside (fit unwraps it)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        names = {p: n for n, p in self.named_parameters()}
        opt.register_step_post_hook(lambda o, a, k: self.used.append(
            {names[p]: p.grad.reshape(-1).tolist() for p in names if p.grad is not None}))
        return opt


def main() -> None:
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 3, generator=g), torch.randint(0, 2, (16,), generator=g))
    model = Classifier()
    cb = GradscapeCallback(sink=str(out / "ddp.sqlite"), every=1, tensors="full")
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=2, callbacks=[cb],
                         enable_progress_bar=False, logger=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=4))
    info = {"wrapper": model.wrapper, "used": model.used,
            "run": cb.tracer.run if cb.tracer is not None else None}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main()
