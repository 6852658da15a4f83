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


class FFLayer(nn.Linear):
    """The forward-forward example's layer: trained on its own (its own optimizer), its forward called
    directly, not through `__call__`."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__(n_in, n_out)
        self.act = nn.ReLU()
        self.opt = torch.optim.SGD(self.parameters(), lr=0.03)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x / (x.norm(2, 1, keepdim=True) + 1e-4)  # @ff-norm
        return self.act(torch.mm(d, self.weight.T) + self.bias.unsqueeze(0))  # @ff-mm

    def train_step(self, x_pos: torch.Tensor, x_neg: torch.Tensor) -> None:
        g_pos = self.forward(x_pos).pow(2).mean(1)  # @ff-pos
        g_neg = self.forward(x_neg).pow(2).mean(1)
        loss = torch.log(1 + torch.exp(torch.cat([2.0 - g_pos, g_neg - 2.0]))).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


class FFNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([FFLayer(6, 8), FFLayer(8, 8)])


def forward_forward(tr: gradscape.Tracer, net: FFNet, traced_layer: int, steps: int = 2) -> list[gradscape.StepTrace]:
    """Layer-local training under one Tracer over the whole net, a step block around one layer's steps."""
    torch.manual_seed(1)
    x_pos, x_neg = torch.randn(16, 6), torch.randn(16, 6)
    out = []
    for i in range(steps):
        h_pos, h_neg = x_pos, x_neg
        for k, layer in enumerate(net.layers):
            assert isinstance(layer, FFLayer)
            if k == traced_layer:
                with tr.step(i) as st:
                    layer.train_step(h_pos, h_neg)
                assert st is not None
                out.append(st)
            else:
                layer.train_step(h_pos, h_neg)
            h_pos, h_neg = layer.forward(h_pos).detach(), layer.forward(h_neg).detach()
    return out
