"""The demo's training loop (run by `gradscape demo` in a child process): a small model learning a
toy task, every Nth step traced and streamed to the server."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from gradscape.tracer.tracing import Tracer


class MLP(nn.Module):
    """The 3-20-30-2 MLP of the forum thread (seed 001)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(3, 20), nn.Linear(20, 30), nn.Linear(30, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc(x.flatten(1))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 32, d: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(16, d))
        block = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.emb(tok) + self.pos[: tok.shape[1]]))


def make(model: str) -> tuple[nn.Module, object]:
    g = torch.Generator().manual_seed(0)
    if model == "mlp":
        w = torch.tensor([0.1, 2.0, 3.0])

        def batch_mlp() -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.rand(16, 3, generator=g)
            return x, (x @ w >= 2.5).long()
        return MLP(), batch_mlp
    if model == "cnn":
        def batch_cnn() -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.randint(0, 10, (16,), generator=g)
            x = torch.randn(16, 1, 16, 16, generator=g) * 0.3 + y.view(-1, 1, 1, 1) / 10
            return x, y
        return CNN(), batch_cnn

    def batch_lm() -> tuple[torch.Tensor, torch.Tensor]:
        tok = torch.randint(0, 32, (8, 16), generator=g)
        return tok, torch.roll(tok, -1, 1)
    return TinyTransformer(), batch_lm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--pause", type=float, default=0.05, help="seconds between steps, so a person can follow")
    args = ap.parse_args()
    torch.manual_seed(0)
    net, batch = make(args.model)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    parent = os.getppid()
    with Tracer(net, run=f"demo-{args.model}", sink=args.url, every=args.every) as tr:
        for i in range(args.steps):
            if os.getppid() != parent:  # `gradscape demo` is gone: do not train on as an orphan
                break
            x, y = batch()  # type: ignore[operator]
            with tr.step(i):
                out = net(x)
                loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
                loss.backward()
            opt.step()
            opt.zero_grad()
            time.sleep(args.pause)


if __name__ == "__main__":
    main()
