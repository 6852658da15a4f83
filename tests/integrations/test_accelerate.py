"""A loop written for Accelerate (`accelerator.prepare`, `accelerator.accumulate`, `accelerator.backward`)
traced by a plain `gradscape.Tracer`: one `tr.step(i)` block around each optimizer step's micro-batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gradcheck import UsedGradients, accumulated
from torch.utils.data import DataLoader, TensorDataset

import gradscape

accelerate = pytest.importorskip("accelerate")


def test_accelerate_loop_with_accumulation_and_a_plain_tracer(tmp_path: Path) -> None:
    k, steps = 2, 3
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(4 * k * steps, 3, generator=g), torch.randint(0, 2, (4 * k * steps,), generator=g))
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=k)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=4))
    inner = accelerator.unwrap_model(model)
    used = UsedGradients(inner.named_parameters(), opt.optimizer)
    path = tmp_path / "acc.sqlite"
    tr = gradscape.Tracer(inner, sink=str(path), run="acc", tensors="full", keep=10)
    batches = iter(loader)
    for i in range(steps):
        with tr.step(i):
            for _ in range(k):
                x, y = next(batches)
                with accelerator.accumulate(model):
                    accelerator.backward(F.cross_entropy(model(x), y))
                    opt.step()  # Accelerate steps on the k-th micro-batch only
                    opt.zero_grad()
    tr.close()
    used.remove()
    with gradscape.TraceStore(path, readonly=True) as store:
        assert [s["step"] for s in store.steps("acc")] == [0, 1, 2]
    assert len(used.steps) == steps
    names = [n for n, _ in inner.named_parameters()]
    for st in tr.steps:
        assert len(st.passes) == k
        assert sorted(n.param for n in st.nodes if n.param) == sorted(names)  # no wrapper's prefix
        _, grads = used.steps[st.step]
        for name in names:
            assert np.array_equal(accumulated(st, name), grads[name]), name
            assert np.array_equal(st.params[name].values, grads[name]), name  # type: ignore[arg-type]
