"""Awkward little models for tests: each `build()` returns (model, batch, loss_fn), deterministic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Case:
    name: str
    model: nn.Module
    batch: tuple[Any, ...]
    loss: Callable[[nn.Module, tuple[Any, ...]], torch.Tensor]


class RankMLP(nn.Module):
    """3-8-2, the model every rank of the torch.distributed tests trains (tests/ddp_*worker.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class SeedMLP(nn.Module):
    """The 3-20-30-2 MLP of seed 001."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 20)
        self.fc2 = nn.Linear(20, 30)
        self.fc3 = nn.Linear(30, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 8, 3)
        self.fc = nn.Linear(8 * 2 * 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.bn1(self.conv1(x))))
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 11, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln1 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.ln2 = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        h = self.emb(tok)
        a, _ = self.attn(h, h, h, need_weights=False)
        h = self.ln1(h + a)
        h = self.ln2(h + self.ff(h))
        return self.head(h)


class Tied(nn.Module):
    """Shared weights: the embedding matrix is also the output projection, and a Linear is used twice."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 5)
        self.mix = nn.Linear(5, 5)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        h = self.emb(tok)
        h = torch.tanh(self.mix(h))
        h = torch.tanh(self.mix(h))
        return h @ self.emb.weight.t()


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 6)
        self.a = nn.Linear(6, 2)
        self.b = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.sigmoid(self.body(x))
        return self.a(h), self.b(h)


class Detached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gate = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        g = torch.sigmoid(self.gate(h.detach()))  # the gate's input is cut from fc's graph
        return h * g


class ScaledSquare(torch.autograd.Function):
    """y = k·a·b with a custom backward."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, k: float, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        ctx.k = k
        return k * a * b

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, torch.Tensor]:
        a, b = ctx.saved_tensors
        return ctx.k * g * b, None, ctx.k * g * a


class CustomFn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1, 1, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ScaledSquare.apply(x, 0.5, self.w)


class GrabBag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.conv = nn.Conv1d(2, 2, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        parts = torch.cat([h[:, :3], torch.tanh(h[:, 3:])], dim=1)
        s = torch.stack([parts, parts * 2], dim=1)  # [B, 2, 6]
        c = self.conv(s)
        w = torch.where(c > 0, c, 0.1 * c)
        return w.pow(2).sum(dim=(1, 2)) / (x.norm(dim=1) + 1)


def _ce(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def _lm(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    tok, tgt = batch
    out = model(tok)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), tgt.reshape(-1))


def _gpt2(layers: int = 4) -> nn.Module:
    """transformers' GPT2LMHeadModel from a small config with random weights (its long qualified names:
    `transformer.h.0.attn.c_attn`); never downloaded."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                      bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM"))


def _hf_lm(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    return model(batch[0], labels=batch[0]).loss


def _two_heads(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    x, y = batch
    a, b = model(x)
    return F.cross_entropy(a, y) + 0.5 * b.pow(2).mean()


def _mean_sq(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    return model(batch[0]).pow(2).mean()


def build(name: str, device: str = "cpu") -> Case:
    """Case `name`, made on the CPU (the same weights and batch on every device), then moved to `device`."""
    case = _build(name)
    if device == "cpu":
        return case
    batch = tuple(t.detach().to(device).requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t
                  for t in case.batch)
    return Case(case.name, case.model.to(device), batch, case.loss)


def _build(name: str) -> Case:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name == "mlp":
        return Case(name, SeedMLP(), (torch.randn(8, 3, generator=g), torch.randint(0, 2, (8,), generator=g)), _ce)
    if name == "cnn":
        return Case(name, SmallCNN(), (torch.randn(4, 1, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g)),
                    _ce)
    if name == "transformer":
        tok = torch.randint(0, 11, (2, 5), generator=g)
        return Case(name, TinyTransformer(), (tok, torch.roll(tok, 1, 1)), _lm)
    if name == "tied":
        tok = torch.randint(0, 7, (3, 4), generator=g)
        return Case(name, Tied(), (tok, torch.roll(tok, 1, 1)), _lm)
    if name == "two_heads":
        return Case(name, TwoHeads(), (torch.randn(5, 4, generator=g), torch.randint(0, 2, (5,), generator=g)),
                    _two_heads)
    if name == "detached":
        return Case(name, Detached(), (torch.randn(3, 4, generator=g, requires_grad=True),), _mean_sq)
    if name == "custom":
        return Case(name, CustomFn(), (torch.randn(6, generator=g, requires_grad=True),), _mean_sq)
    if name == "gpt2":  # a live page's model of issue 22: transformers' GPT-2, small config, random weights
        return Case(name, _gpt2(), (torch.randint(0, 64, (2, 8), generator=g),), _hf_lm)
    if name == "grabbag":
        return Case(name, GrabBag(), (torch.randn(4, 6, generator=g),), lambda m, b: m(b[0]).mean())
    raise KeyError(name)


ZOO = ["mlp", "cnn", "transformer", "tied", "two_heads", "detached", "custom", "grabbag"]


def loop_step(tr: Any, step: int, length: int) -> Any:
    """One traced step of `tr`'s model, a ModuleDict of an `nn.LSTMCell(4, 16)` "cell" and a
    `nn.Linear(16, 1)` "head", unrolled `length` times (about 15 autograd nodes a time step)."""
    cell, head = tr.model["cell"], tr.model["head"]
    x = torch.randn(length, 4, 4)
    with tr.step(step) as st:
        h = c = x.new_zeros(4, 16)
        outs = []
        for t in range(length):
            h, c = cell(x[t], (h, c))
            outs.append(head(h))
        torch.stack(outs).pow(2).mean().backward()
    return st


def loop_model() -> nn.ModuleDict:
    """The model `loop_step` runs."""
    return nn.ModuleDict({"cell": nn.LSTMCell(4, 16), "head": nn.Linear(16, 1)})
