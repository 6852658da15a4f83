"""Benchmark workloads for gradscape's overhead measurements.

Each builder returns a `Workload` with `.name`, `.model`, `.batch()` (inputs/targets made once with a
fixed seed and reused) and `.loss(model, batch)` (a scalar loss). Models are built under
`torch.manual_seed` so every run sees the same weights.

    W1 mlp    3-20-30-2 MLP, batch 64, cross-entropy on random {0,1} labels
    W2 lenet  LeNet-like CNN on [64,1,28,28], cross-entropy over 10 classes
    W3 gpt6   6-layer GPT-like decoder, d=384, 6 heads, seq 128, batch 8
    W4 gpt12  12-layer GPT-like decoder, d=768, 12 heads, seq 128, batch 4

Small programs of the kind the PyTorch examples repository and nanoGPT hold, as stand-ins (bench/small_programs.py):

    W6 regression     a linear regression on polynomial features (x, x², x³, x⁴), batch 32, smooth L1
    W7 actor-critic   a policy MLP (4-128-2 with a value head) over a 10-step episode, REINFORCE with baseline
    W8 word-lm        a word-language-model TransformerEncoder (2 layers, d=200, 2 heads), bptt 35, batch 20
    W9 nanogpt-fp16   a nanoGPT-like decoder (4 layers, d=128, 4 heads, seq 64, batch 8, vocab 65) under
                      autocast to float16 (bfloat16 where float16 autocast does not run)
    W10 nanogpt-bf16  the same under autocast to bfloat16

`lstm_loop(nodes)`: an `nn.LSTMCell` loop unrolled over time, about `nodes` autograd nodes (bench/pernode.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SEED = 0


@dataclass
class Workload:
    name: str
    model: nn.Module
    make_batch: Callable[[], Any]
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]
    _batch: Any = field(default=None, repr=False)

    def batch(self) -> Any:
        """The workload's inputs/targets: created once (fixed seed), then reused."""
        if self._batch is None:
            self._batch = self.make_batch()
        return self._batch

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return self.loss_fn(model, batch)


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def _classification_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


# --------------------------------------------------------------------------- W1, W2


def mlp(device: str | torch.device = "cpu") -> Workload:
    """W1: the 3-20-30-2 MLP, batch 64."""
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Linear(3, 20), nn.ReLU(),
        nn.Linear(20, 30), nn.ReLU(),
        nn.Linear(30, 2),
    ).to(device)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(SEED + 1)
        x = torch.randn(64, 3, generator=g)
        y = torch.randint(0, 2, (64,), generator=g)
        return x.to(device), y.to(device)

    return Workload("mlp", model, make_batch, _classification_loss)


def lenet(device: str | torch.device = "cpu") -> Workload:
    """W2: a LeNet-like CNN on [64,1,28,28], 10 classes."""
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10),
    ).to(device)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(SEED + 2)
        x = torch.randn(64, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (64,), generator=g)
        return x.to(device), y.to(device)

    return Workload("lenet", model, make_batch, _classification_loss)


# --------------------------------------------------------------------------- W3, W4: GPT-like decoder


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # [B, T, C] -> [B, heads, T, C/heads]
        q = q.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        k = k.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        v = v.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, n_layers: int, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.seq_len:
            raise ValueError(f"sequence length {t} exceeds the model's {self.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _next_token_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _gpt(name: str, n_layers: int, d_model: int, n_heads: int, batch: int,
         device: str | torch.device, seq_len: int = 128, vocab: int = 1000) -> Workload:
    torch.manual_seed(SEED)
    model = GPT(vocab, seq_len, n_layers, d_model, n_heads).to(device)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(SEED + 3)
        tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=g).to(device)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return Workload(name, model, make_batch, _next_token_loss)


def gpt6(device: str | torch.device = "cpu") -> Workload:
    """W3: 6 layers, d=384, 6 heads, seq 128, batch 8."""
    return _gpt("gpt6", n_layers=6, d_model=384, n_heads=6, batch=8, device=device)


def gpt12(device: str | torch.device = "cpu") -> Workload:
    """W4: 12 layers, d=768, 12 heads, seq 128, batch 4."""
    return _gpt("gpt12", n_layers=12, d_model=768, n_heads=12, batch=4, device=device)


def lenet_compiled(device: str | torch.device = "cpu") -> Workload:
    """W5: W2 under `torch.compile` (plain = the untraced compiled step; traced steps run it eagerly)."""
    w = lenet(device)
    w.model = torch.compile(w.model)  # type: ignore[assignment]
    w.name = "lenet-compiled"
    return w


# --------------------------------------------------------------------------- the page at scale


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x)) * 0.5


def residual_stages(stages: int = 50, blocks: int = 29) -> nn.Module:
    """The page's scale model (bench/ui.py, the browser's 10k-node test): `stages` top-level stages of
    `blocks` residual blocks each; at the defaults, 1,450 blocks and about 10,150 autograd nodes for a
    [2, 4] input. Built under `torch.manual_seed(SEED)`."""
    torch.manual_seed(SEED)
    return nn.Sequential(*[nn.Sequential(*[_Residual() for _ in range(blocks)]) for _ in range(stages)])


# --------------------------------------------------------------------------- many small ops


class _CellLoop(nn.Module):
    """An `nn.LSTMCell` (4 → hidden 32) unrolled over the sequence, a Linear read-out at every time step:
    about 17 autograd nodes per time step, each on an 8×32 tensor or smaller."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = nn.LSTMCell(4, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[1], self.hidden)
        c = x.new_zeros(x.shape[1], self.hidden)
        outs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
            outs.append(self.head(h))
        return torch.stack(outs)


NODES_PER_TIME_STEP = 17  # of `_CellLoop`


def lstm_loop(nodes: int = 10_000, device: str | torch.device = "cpu", batch: int = 8) -> Workload:
    """An `nn.LSTMCell` loop (hidden 32, batch 8) unrolled over time to about `nodes` autograd nodes,
    mean-squared error against random targets."""
    torch.manual_seed(SEED)
    model = _CellLoop().to(device)
    steps = max(1, nodes // NODES_PER_TIME_STEP)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(SEED + 4)
        return (torch.randn(steps, batch, 4, generator=g).to(device),
                torch.randn(steps, batch, 1, generator=g).to(device))

    def loss(model: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(model(b[0]), b[1])

    return Workload(f"lstm{nodes}", model, make_batch, loss)


class _Scan(nn.Module):
    """A recurrence written out in the forward, h ← tanh(h·w + x_t·u) (hidden 32), then a Linear read-out:
    four autograd nodes per time step, every one the scan's own (no submodule, one call)."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(hidden) * 0.5)
        self.u = nn.Parameter(torch.randn(4, hidden) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[1], self.w.shape[0])
        for xt in x:
            h = torch.tanh(h * self.w + xt @ self.u)
        return h


class _ScanLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scan = _Scan()
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scan(x))


def scan_loop(nodes: int = 10_000, device: str | torch.device = "cpu", batch: int = 8) -> Workload:
    """`_Scan` over time to about `nodes` autograd nodes, all in one module called once (its ops open in
    runs: app/view/op_runs.py), mean-squared error against random targets."""
    torch.manual_seed(SEED)
    model = _ScanLoop().to(device)
    steps = max(1, nodes // 4)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(SEED + 5)
        return torch.randn(steps, batch, 4, generator=g).to(device), torch.randn(batch, 1, generator=g).to(device)

    def loss(model: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(model(b[0]), b[1])

    return Workload(f"scan{nodes}", model, make_batch, loss)


# the small programs build on the definitions above; bench scripts import this file as `workloads`,
# the tests as `bench.workloads`
if __package__:
    from .small_programs import actor_critic, nanogpt_amp, nanogpt_bf16, regression, word_lm  # noqa: E402
else:
    from small_programs import actor_critic, nanogpt_amp, nanogpt_bf16, regression, word_lm  # noqa: E402

WORKLOADS: dict[str, Callable[..., Workload]] = {"W1": mlp, "W2": lenet, "W3": gpt6, "W4": gpt12,
                                                 "W5": lenet_compiled, "W6": regression, "W7": actor_critic,
                                                 "W8": word_lm, "W9": nanogpt_amp, "W10": nanogpt_bf16}


def build(key: str, device: str | torch.device = "cpu") -> Workload:
    """Build workload `key` ("W1".."W4", or its name such as "gpt6") on `device`."""
    if key in WORKLOADS:
        return WORKLOADS[key](device)
    for fn in WORKLOADS.values():
        if fn.__name__ == key:
            return fn(device)
    raise KeyError(f"unknown workload {key!r}; choose from {', '.join(WORKLOADS)}")
