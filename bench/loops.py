"""Training loops whose step is more than one loss, one backward and one optimizer step: the shapes of the
programs the real-loops issue measured, written here (not copied), for bench/loop_costs.py.

Each builder returns a `Loop`: the module a `Tracer` watches and `step()`, one whole training step as the
program runs it.

    gan             a GAN with two Adam optimizers: the discriminator on a real and a fake batch (two
                    backward calls), then the generator (a third), DCGAN's step, on two small MLPs (a step
                    of about 1.5 ms: what three calls and two optimizer steps cost a traced step, fixed)
    dcgan           the same step on DCGAN's shape at 32 × 32: transposed convolutions and batch norm in the
                    generator, strided convolutions in the discriminator, `BCELoss` on its sigmoid
    rnn_clipped     an LSTM language model updated by hand: `clip_grad_norm_(…, 0.25)`, then
                    `p.data.add_(p.grad, alpha=-lr)`, no optimizer (word_language_model's loop)
    forward_forward two layers trained layer-locally, each with its own optimizer and its own backward on a
                    positive and a negative batch (four backward calls)
    gcn             a two-layer graph convolution over a sparse normalised adjacency (`torch.sparse.mm`)
    llama, t5, vit  small transformers models built from their configs (random weights), AdamW
    gpt_micro<k>    a tiny GPT trained with gradient accumulation over k micro-batches (k backward calls
                    and one AdamW step), nanoGPT's loop; k = 1, 2, 8, 40
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

if __package__:
    from .workloads import GPT, SEED, _generator
else:
    from workloads import GPT, SEED, _generator


@dataclass
class Loop:
    name: str
    model: nn.Module
    step: Callable[[], None]


def gan() -> Loop:
    torch.manual_seed(SEED)
    g_net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.Tanh())
    d_net = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
    opt_g, opt_d = torch.optim.Adam(g_net.parameters(), 2e-4), torch.optim.Adam(d_net.parameters(), 2e-4)
    gen = _generator(SEED + 1)
    real, noise = torch.randn(64, 32, generator=gen), torch.randn(64, 16, generator=gen)
    return _gan_loop("gan", g_net, d_net, (opt_g, opt_d), (real, noise), F.binary_cross_entropy_with_logits,
                     (64, 1))


def _gan_loop(name: str, g_net: nn.Module, d_net: nn.Module, opts: tuple[torch.optim.Optimizer, ...],
              data: tuple[torch.Tensor, torch.Tensor], loss: Callable[..., torch.Tensor],
              labels: tuple[int, ...]) -> Loop:
    """DCGAN's step: the discriminator on a real and a fake batch (two backward calls, then its optimizer), the
    generator through it (a third, then the generator's optimizer); `labels`: the shape of its output."""
    (opt_g, opt_d), (real, noise) = opts, data
    ones, zeros = torch.ones(labels), torch.zeros(labels)

    def step() -> None:
        d_net.zero_grad()
        loss(d_net(real), ones).backward()
        fake = g_net(noise)
        loss(d_net(fake.detach()), zeros).backward()
        opt_d.step()
        g_net.zero_grad()
        loss(d_net(fake), ones).backward()
        opt_g.step()

    return Loop(name, nn.ModuleDict({"G": g_net, "D": d_net}), step)


def _up(c_in: int, c_out: int, first: bool = False) -> list[nn.Module]:
    """A generator block: a transposed convolution (4 × 4 from 1 × 1 when `first`, else twice the side)."""
    conv = nn.ConvTranspose2d(c_in, c_out, 4, 1, 0, bias=False) if first else nn.ConvTranspose2d(c_in, c_out, 4, 2, 1,
                                                                                                bias=False)
    return [conv, nn.BatchNorm2d(c_out), nn.ReLU(True)]


def _down(c_in: int, c_out: int, norm: bool = True) -> list[nn.Module]:
    """A discriminator block: a strided convolution halving the side."""
    return [nn.Conv2d(c_in, c_out, 4, 2, 1, bias=False), *([nn.BatchNorm2d(c_out)] if norm else []),
            nn.LeakyReLU(0.2, True)]


def dcgan(nz: int = 32, width: int = 16, batch: int = 16) -> Loop:
    torch.manual_seed(SEED)
    g_net = nn.Sequential(*_up(nz, 4 * width, first=True), *_up(4 * width, 2 * width), *_up(2 * width, width),
                          nn.ConvTranspose2d(width, 3, 4, 2, 1, bias=False), nn.Tanh())
    d_net = nn.Sequential(*_down(3, width, norm=False), *_down(width, 2 * width), *_down(2 * width, 4 * width),
                          nn.Conv2d(4 * width, 1, 4, 1, 0, bias=False), nn.Sigmoid(), nn.Flatten(0))
    opt_g = torch.optim.Adam(g_net.parameters(), 2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d_net.parameters(), 2e-4, betas=(0.5, 0.999))
    gen = _generator(SEED + 9)
    real, noise = torch.rand(batch, 3, 32, 32, generator=gen) * 2 - 1, torch.randn(batch, nz, 1, 1, generator=gen)
    return _gan_loop("dcgan", g_net, d_net, (opt_g, opt_d), (real, noise), F.binary_cross_entropy, (batch,))


class _RNNLM(nn.Module):
    def __init__(self, vocab: int = 1000, d: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, num_layers=2)
        self.out = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(x))
        return self.out(h)


def rnn_clipped(lr: float = 20.0) -> Loop:
    torch.manual_seed(SEED)
    model = _RNNLM()
    tokens = torch.randint(0, 1000, (36, 20), generator=_generator(SEED + 2))
    x, y = tokens[:-1], tokens[1:]

    def step() -> None:
        model.zero_grad()
        F.cross_entropy(model(x).reshape(-1, 1000), y.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)  # type: ignore[arg-type]

    return Loop("rnn_clipped", model, step)


def forward_forward(threshold: float = 2.0) -> Loop:
    torch.manual_seed(SEED)
    layers = nn.ModuleList([nn.Linear(64, 128), nn.Linear(128, 128)])
    opts = [torch.optim.Adam(layer.parameters(), 1e-3) for layer in layers]
    gen = _generator(SEED + 3)
    pos, neg = torch.randn(128, 64, generator=gen), torch.randn(128, 64, generator=gen)

    def step() -> None:
        h_pos, h_neg = pos, neg
        for layer, opt in zip(layers, opts):
            for x, sign in ((h_pos, -1.0), (h_neg, 1.0)):
                g = F.relu(layer(F.normalize(x, dim=1))).pow(2).mean(1)
                opt.zero_grad()
                F.softplus(sign * (g - threshold)).mean().backward()
                opt.step()
            with torch.no_grad():
                h_pos = F.relu(layer(F.normalize(h_pos, dim=1)))
                h_neg = F.relu(layer(F.normalize(h_neg, dim=1)))

    return Loop("forward_forward", layers, step)


class _GCN(nn.Module):
    def __init__(self, adj: torch.Tensor, d_in: int = 32, d_h: int = 64, classes: int = 7) -> None:
        super().__init__()
        self.adj = adj
        self.l1, self.l2 = nn.Linear(d_in, d_h), nn.Linear(d_h, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(torch.sparse.mm(self.adj, self.l1(x)))
        return torch.sparse.mm(self.adj, self.l2(F.dropout(h, 0.5, self.training)))


def gcn(nodes: int = 500, edges: int = 2000) -> Loop:
    torch.manual_seed(SEED)
    gen = _generator(SEED + 4)
    src, dst = torch.randint(0, nodes, (edges,), generator=gen), torch.randint(0, nodes, (edges,), generator=gen)
    idx = torch.cat([torch.stack([src, dst]), torch.stack([dst, src]), torch.arange(nodes).repeat(2, 1)], 1)
    adj = torch.sparse_coo_tensor(idx, torch.ones(idx.shape[1]), (nodes, nodes), check_invariants=True).coalesce()
    deg = torch.sparse.sum(adj, 1).to_dense()
    norm = deg[adj.indices()[0]].rsqrt() * deg[adj.indices()[1]].rsqrt()
    adj = torch.sparse_coo_tensor(adj.indices(), norm, (nodes, nodes), check_invariants=True).coalesce()
    model = _GCN(adj)
    opt = torch.optim.Adam(model.parameters(), 0.01, weight_decay=5e-4)
    x, y = torch.randn(nodes, 32, generator=gen), torch.randint(0, 7, (nodes,), generator=gen)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return Loop("gcn", model, step)


def _hf(name: str, model: nn.Module, batch: dict[str, torch.Tensor]) -> Loop:
    opt = torch.optim.AdamW(model.parameters(), 1e-4)
    model.train()

    def step() -> None:
        opt.zero_grad()
        model(**batch).loss.backward()
        opt.step()

    return Loop(name, model, step)


def llama() -> Loop:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ids = torch.randint(0, 256, (4, 32), generator=_generator(SEED + 5))
    return _hf("llama", LlamaForCausalLM(cfg), {"input_ids": ids, "labels": ids})


def t5() -> Loop:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(SEED)
    cfg = T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                   decoder_start_token_id=0, pad_token_id=0)
    gen = _generator(SEED + 6)
    src, tgt = torch.randint(1, 256, (4, 24), generator=gen), torch.randint(1, 256, (4, 16), generator=gen)
    return _hf("t5", T5ForConditionalGeneration(cfg), {"input_ids": src, "labels": tgt})


def vit() -> Loop:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(SEED)
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, num_labels=10)
    gen = _generator(SEED + 7)
    pixels, labels = torch.randn(8, 3, 32, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)
    return _hf("vit", ViTForImageClassification(cfg), {"pixel_values": pixels, "labels": labels})


def gpt_micro(k: int, batch: int = 4, seq_len: int = 64, vocab: int = 256) -> Loop:
    """nanoGPT's loop at a tiny size: k micro-batches, each `(loss / k).backward()`, then one AdamW step."""
    torch.manual_seed(SEED)
    model = GPT(vocab, seq_len, 2, 64, 4)
    opt = torch.optim.AdamW(model.parameters(), 6e-4)
    tokens = torch.randint(0, vocab, (k, batch, seq_len + 1), generator=_generator(SEED + 8))

    def step() -> None:
        for m in range(k):
            logits = model(tokens[m, :, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[m, :, 1:].reshape(-1))
            (loss / k).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return Loop(f"gpt_micro{k}", model, step)


LOOPS: dict[str, Callable[[], Loop]] = {
    "gan": gan, "dcgan": dcgan, "rnn_clipped": rnn_clipped, "forward_forward": forward_forward, "gcn": gcn,
    "llama": llama, "t5": t5, "vit": vit,
    **{f"gpt_micro{k}": (lambda k=k: gpt_micro(k)) for k in (1, 2, 8, 40)},  # type: ignore[misc]
}
