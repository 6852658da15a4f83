"""Run by tests/integrations/test_extras.py inside a fresh environment holding the installed wheel and its
extras: a Lightning fit traced by GradscapeCallback (accumulate_grad_batches=2), and the transformers
callback made. Prints one line that the test checks."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from gradscape.integrations.huggingface import GradscapeCallback as HFCallback
from gradscape.integrations.lightning import GradscapeCallback


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    HFCallback(every=10)  # the transformers callback imports and takes its options
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 3, generator=g), torch.randint(0, 2, (16,), generator=g))
    cb = GradscapeCallback(every=1, keep=4)
    pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, accumulate_grad_batches=2, callbacks=[cb],
               enable_progress_bar=False, logger=False, enable_checkpointing=False,
               enable_model_summary=False).fit(Classifier(), DataLoader(data, batch_size=4))
    assert cb.tracer is not None
    steps = list(cb.tracer.steps)
    names = ",".join(sorted(steps[-1].params))
    print(f"steps {[st.step for st in steps]} passes {[len(st.passes) for st in steps]} params {names}")


if __name__ == "__main__":
    main()
