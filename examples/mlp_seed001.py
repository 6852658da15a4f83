"""The 3-20-30-2 MLP from the forum thread in seed 001, traced every step of a real loop.

Run it with `python examples/mlp_seed001.py` (`make run` runs `gradscape demo`, the live server
with a bundled loop, instead). It trains for a few steps, writes
every step to `runs/mlp.sqlite`, and prints what autograd did in the last one: each node's
grad_outputs (arriving) and grad_inputs (sent on), every slot named, and each layer's
grad_input / grad_output as register_full_backward_hook defines them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradscape


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 20)
        self.fc2 = nn.Linear(20, 30)
        self.fc3 = nn.Linear(30, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--out", default="runs/mlp.sqlite")
    args = ap.parse_args()

    torch.manual_seed(0)
    x_all = torch.rand(9000, 3)
    y_all = (x_all @ torch.tensor([0.1, 2.0, 3.0]) >= 2.5).long()
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.8)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)

    with gradscape.Tracer(net, run="mlp-seed001", sink=args.out) as tr:
        for i in range(args.steps):
            idx = torch.randint(0, len(x_all), (args.batch,))
            with tr.step(i) as st:
                loss = F.cross_entropy(net(x_all[idx]), y_all[idx])
                loss.backward()
            opt.step()
            opt.zero_grad()
    assert st is not None
    print(st.summary())
    print(f"\n{args.steps} traced steps written to {args.out}; read one back with gradscape.load({args.out!r}).")


if __name__ == "__main__":
    main()
