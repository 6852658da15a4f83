"""Small programs of the kind the PyTorch examples repository and nanoGPT hold, written as stand-ins for
bench/overhead.py (W6-W10, listed in bench/workloads.py, which imports this module at its end: import
the workloads through it). Each builder returns a `Workload`."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

if __package__:  # imported as bench.small_programs (the tests), else from a bench script's folder
    from .workloads import SEED, Workload, _generator, _gpt
else:
    from workloads import SEED, Workload, _generator, _gpt


def regression(device: str | torch.device = "cpu") -> Workload:
    """W6: y = w·(x, x², x³, x⁴) + b fitted by a Linear(4, 1), batch 32, smooth L1 loss."""
    torch.manual_seed(SEED)
    model = nn.Linear(4, 1).to(device)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(SEED + 5)
        x = torch.randn(32, 1, generator=g)
        feats = torch.cat([x ** i for i in range(1, 5)], 1)
        y = feats @ torch.randn(4, 1, generator=g) + 5.0
        return feats.to(device), y.to(device)

    def loss(model: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.smooth_l1_loss(model(b[0]), b[1])

    return Workload("regression", model, make_batch, loss)


class _Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.action_head = nn.Linear(128, 2)
        self.value_head = nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.affine1(x))
        return F.softmax(self.action_head(h), dim=-1), self.value_head(h)


def actor_critic(device: str | torch.device = "cpu", steps: int = 10) -> Workload:
    """W7: an episode of `steps` single-state forwards of a policy MLP, then the REINFORCE-with-baseline
    loss over it (policy loss from the log-probability of each action taken, smooth L1 value loss)."""
    torch.manual_seed(SEED)
    model = _Policy().to(device)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = _generator(SEED + 6)
        states = torch.randn(steps, 1, 4, generator=g)
        actions = torch.randint(0, 2, (steps,), generator=g)  # fixed, so every step is the same work
        ret, returns = 0.0, []
        for _ in range(steps):  # discounted returns of a reward of 1 per step, gamma 0.99
            ret = 1.0 + 0.99 * ret
            returns.insert(0, ret)
        r = torch.tensor(returns)
        r = (r - r.mean()) / (r.std() + 1e-6)
        return states.to(device), actions.to(device), r.to(device)

    def loss(model: nn.Module, b: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        states, actions, returns = b
        policy_losses, value_losses = [], []
        for t in range(states.shape[0]):
            probs, value = model(states[t])
            log_prob = torch.distributions.Categorical(probs).log_prob(actions[t:t + 1])
            advantage = returns[t] - value.item()
            policy_losses.append(-log_prob * advantage)
            value_losses.append(F.smooth_l1_loss(value.reshape(1), returns[t:t + 1]))
        return torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()

    return Workload("actor-critic", model, make_batch, loss)


class _WordLM(nn.Module):
    """The word-language-model Transformer: embedding × √d, sinusoidal positions, a TransformerEncoder
    with a causal mask, a Linear decoder and log-softmax."""

    def __init__(self, ntoken: int = 1000, d: int = 200, nhead: int = 2, nhid: int = 200, nlayers: int = 2,
                 bptt: int = 35) -> None:
        super().__init__()
        self.d = d
        self.encoder = nn.Embedding(ntoken, d)
        pos = torch.arange(bptt).unsqueeze(1)
        div = torch.exp(torch.arange(0, d, 2) * (-torch.log(torch.tensor(10000.0)) / d))
        pe = torch.zeros(bptt, 1, d)
        pe[:, 0, 0::2], pe[:, 0, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe)
        self.drop = nn.Dropout(0.2)
        self.transformer = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, nhead, nhid, 0.2), nlayers,
                                                 enable_nested_tensor=False)
        self.decoder = nn.Linear(d, ntoken)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(bptt))

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.encoder(src) * self.d ** 0.5 + self.pe[:src.shape[0]])
        return F.log_softmax(self.decoder(self.transformer(x, self.mask)), dim=-1)


def word_lm(device: str | torch.device = "cpu", bptt: int = 35, batch: int = 20, ntoken: int = 1000) -> Workload:
    """W8: the word-language-model Transformer on a [bptt, batch] slice of token ids, NLL loss."""
    torch.manual_seed(SEED)
    model = _WordLM(ntoken=ntoken, bptt=bptt).to(device)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(SEED + 7)
        data = torch.randint(0, ntoken, (bptt + 1, batch), generator=g).to(device)
        return data[:-1], data[1:].reshape(-1)

    def loss(model: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        out = model(b[0])
        return F.nll_loss(out.view(-1, out.shape[-1]), b[1])

    return Workload("word-lm", model, make_batch, loss)


def nanogpt_amp(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16) -> Workload:
    """W9 (float16) and W10 (bfloat16): a nanoGPT-like decoder (the GPT of W3/W4, 4 layers, d=128,
    4 heads, seq 64, batch 8, a 65-character vocabulary) with its forward and loss under autocast to
    `dtype`; W9 falls back to bfloat16 where the device's autocast does not run float16. (On a CPU
    without native float16 arithmetic a float16 step is an order of magnitude slower than a bfloat16
    one, so W10 is the one whose ratio shows the tracer's cost.)"""
    dev = torch.device(device).type
    if dtype == torch.float16 and not _autocasts_to(dev, dtype):
        dtype = torch.bfloat16
    name = "nanogpt-" + ("fp16" if dtype == torch.float16 else "bf16")
    w = _gpt(name, n_layers=4, d_model=128, n_heads=4, batch=8, device=device, seq_len=64, vocab=65)
    inner = w.loss_fn

    def loss(model: nn.Module, b: Any) -> torch.Tensor:
        with torch.autocast(dev, dtype=dtype):
            return inner(model, b)

    w.loss_fn = loss
    return w


def nanogpt_bf16(device: str | torch.device = "cpu") -> Workload:
    """W10: `nanogpt_amp` under autocast to bfloat16."""
    return nanogpt_amp(device, torch.bfloat16)


def _autocasts_to(device_type: str, dtype: torch.dtype) -> bool:
    """True when autocast on `device_type` runs a matmul in `dtype`."""
    try:
        with torch.autocast(device_type, dtype=dtype):
            return (torch.ones(2, 2, device=device_type) @ torch.ones(2, 2, device=device_type)).dtype == dtype
    except (RuntimeError, ValueError):
        return False
