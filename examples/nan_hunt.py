"""Tutorial 4: hunting a NaN to the op and the line where it was born.

    python examples/nan_hunt.py

A loss goes NaN. `torch.autograd.detect_anomaly` names the first *backward* node that made a NaN, which is
often later than the cause, and says nothing when every gradient is finite. gradscape's problem finder
looks where the value was born: when a backward starts from a NaN/Inf loss it reads the graph's saved
tensors in forward order and names the first op that made a non-finite value from finite inputs, with its
source line. Here that is the inner `sqrt` of `sqrt(sqrt(h - 2))`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn as nn

import gradscape


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.head = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        z = torch.sqrt(torch.sqrt(h - 2))  # the inner sqrt makes NaN where h < 2; the outer one only passes it on
        return self.head(z)


def loss_of(net: Net, x: torch.Tensor) -> torch.Tensor:
    return net(x).pow(2).mean()


def main() -> dict[str, Any]:
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(8, 4)

    tr = gradscape.Tracer(net)
    with tr.step(0) as st:
        loss = loss_of(net, x)
        loss.backward()
    assert st is not None and torch.isnan(loss)

    for p in st.problems:  # root cause first
        print(f"{p.kind:20s} {p.source or '':22s} {p.message}")
    born = st.problems[0]
    node = st.nodes[born.node]  # type: ignore[index]
    print(f"\nborn at node {born.node}: {node.name} in module {node.module}, line {born.source}")

    # Check against torch: replay the forward op by op; the first op whose output is not finite from finite
    # inputs is the inner sqrt, on the line that `forward` holds it
    h = net.fc(x)
    steps = [("fc", x, h), ("sub", h, h - 2), ("inner sqrt", h - 2, torch.sqrt(h - 2)),
             ("outer sqrt", torch.sqrt(h - 2), torch.sqrt(torch.sqrt(h - 2)))]
    first = next(name for name, a, b in steps if torch.isfinite(a).all() and not torch.isfinite(b).all())
    assert first == "inner sqrt"
    lines, start = inspect.getsourcelines(Net.forward)
    line = start + next(i for i, text in enumerate(lines) if "torch.sqrt(torch.sqrt" in text)
    assert born.kind == "nonfinite_forward" and node.name == "SqrtBackward0" and node.module == "<root>"
    assert born.source == f"nan_hunt.py:{line}", born.source
    # it names the inner sqrt: the SqrtBackward0 node whose input came from the subtraction
    below = [st.nodes[dst].name for src, dst, _ in st.edges if src == node.id]
    assert below and below[0].startswith("SubBackward"), below
    return {"kinds": [p.kind for p in st.problems], "source": born.source, "node": node.name}


if __name__ == "__main__":
    main()
