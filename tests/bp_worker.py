"""A small real training loop for the breakpoint tests: an MLP (fc1 → ReLU → fc2) trained with SGD,
streaming into a gradscape server. Prints `ready` once its breakpoint link is up, `step i` after each
step, and at the end one JSON line with the final parameters (bytes as hex, for bitwise checks).
With `--url` left out it trains untraced: the reference run."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import gradscape
from gradscape.tracer.record.debug.breakpoints import breaker


def build(seed: int = 0, device: str = "cpu") -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential()
    model.add_module("fc1", torch.nn.Linear(6, 8))
    model.add_module("act", torch.nn.ReLU())
    model.add_module("fc2", torch.nn.Linear(8, 3))
    x = torch.randn(16, 6)
    y = torch.randint(0, 3, (16,))
    return model.to(device), x.to(device), y.to(device)


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, tr: gradscape.Tracer | None,
          blowup: int | None = None, gate: int | None = None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        if i == gate:  # hold here until the test says go (a line on stdin)
            print("gate", flush=True)
            sys.stdin.readline()
        inp = x * float("inf") if i == blowup else x
        if tr is not None:
            with tr.step(i):
                torch.nn.functional.cross_entropy(model(inp), y).backward()
        else:
            torch.nn.functional.cross_entropy(model(inp), y).backward()
        opt.step()
        opt.zero_grad()
        print(f"step {i}", flush=True)


def params_hex(model: torch.nn.Module) -> dict[str, str]:
    return {k: v.detach().cpu().numpy().tobytes().hex() for k, v in model.state_dict().items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=None)
    ap.add_argument("--run", default="bp")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--grace", type=float, default=None)
    ap.add_argument("--blowup", type=int, default=None, help="feed Inf inputs at this step")
    ap.add_argument("--gate", type=int, default=None, help="wait for a line on stdin before this step")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, x, y = build()
    tr = None
    if args.url:
        from gradscape.tracer.sinks.socket import SocketSink

        sink = SocketSink(args.url, args.run, break_grace=args.grace)
        tr = gradscape.Tracer(model, run=args.run, sink=sink)
        b = breaker(args.run)
        while not (b.link is not None and b.link.connected):
            time.sleep(0.02)
        print("ready", flush=True)
        sys.stdin.readline()  # the test says when to start (after setting its breakpoints)
    train(model, x, y, args.steps, tr, args.blowup, args.gate)
    if tr is not None:
        tr.close(10)
    print(json.dumps({"params": params_hex(model), "pauses": breaker(args.run).pauses}), flush=True)


if __name__ == "__main__":
    main()
