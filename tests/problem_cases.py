"""Steps with known problems, shared by tests/test_problems.py and the browser tests: each runs one
traced step and checks with torch itself that the problem is really there."""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn

import gradscape


def line_of(marker: str) -> str:
    """`problem_cases.py:N` of the line of this file that ends with `# marker`."""
    lines = inspect.getsource(inspect.getmodule(line_of)).splitlines()  # type: ignore[arg-type]
    (n,) = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    return f"problem_cases.py:{n}"


def sqrt_of_sqrt(tr: gradscape.Tracer, i: int = 0) -> gradscape.StepTrace:
    """`y = sqrt(x - 2); z = sqrt(y)`: the NaN is born in the first sqrt, detect_anomaly blames the second."""
    x = torch.tensor([1.0, 3.0], requires_grad=True)
    with tr.step(i) as st:
        y = torch.sqrt(x - 2)  # @inner-sqrt
        z = torch.sqrt(y).sum()  # @outer-sqrt
        z.backward()
    assert st is not None
    assert torch.isnan(y[0]) and torch.isnan(z)
    return st


def sqrt_at_zero(tr: gradscape.Tracer, i: int = 0) -> gradscape.StepTrace:
    x = torch.tensor([0.0, 4.0], requires_grad=True)
    with tr.step(i) as st:
        y = torch.sqrt(x).sum()  # @sqrt-at-zero
        y.backward()
    assert st is not None
    return st


def log_of_negative(tr: gradscape.Tracer, i: int = 0) -> gradscape.StepTrace:
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with tr.step(i) as st:
        loss = torch.log(-x).sum()  # @log
        loss.backward()
    assert st is not None
    return st


class WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)
        self.spare = nn.Linear(8, 8)  # never called
        self.side = nn.Linear(8, 3)  # called, but its output is cut off

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        side = self.side(h)  # @side-made
        self.aux = side.detach()  # @side-cut
        return self.fc2(h)


def unused_layer(tr: gradscape.Tracer, model: nn.Module, i: int = 0) -> gradscape.StepTrace:
    with tr.step(i) as st:
        model(torch.randn(5, 4)).pow(2).mean().backward()
    assert st is not None
    return st
