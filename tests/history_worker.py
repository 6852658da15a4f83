"""A training loop with the monitor on, streaming into a gradscape server (the history tests and the
timeline's browser test run it as a subprocess). One batch at step `--spike` is scaled ×100, so a
trigger fires there; at step `--nan` (if given) the loss is the log of a negative value, a NaN, and the
optimizer does not step. With `--hold FILE`, the loop waits before the spike's step until FILE exists
(a test that must see the page before the trigger fires). Every step is a full one (`--norms-every`, 1 unless
given: NOTE [Light steps] in tracer/monitor/light.py), so that a loss trigger traces its own step whatever this
machine's speed. Prints one JSON line at the end: the Tracer's history rows and sink counts."""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torch.nn as nn

import gradscape


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--spike", type=int, default=30)
    ap.add_argument("--nan", type=int, default=-1)
    ap.add_argument("--pause", type=float, default=0.0)
    ap.add_argument("--hold", default=None)
    ap.add_argument("--norms-every", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tr = gradscape.Tracer(model, run=args.run, sink=args.url, every=args.every, norms_every=args.norms_every)
    for i in range(args.steps):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        if i == args.spike:
            while args.hold and not os.path.exists(args.hold):
                time.sleep(0.01)
            x, y = x * 100, y * 100
        with tr.step(i):
            out = model(x)
            loss = torch.log(-out.abs() - 1).mean() if i == args.nan else (out - y).pow(2).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if i != args.nan:
                opt.step()
            opt.zero_grad()
        print(f"step {i}", flush=True)
        time.sleep(args.pause)
    tr.close(20.0)
    rows = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
            for r in tr.history]
    print(json.dumps({"stats": tr.stats, "history": rows}), flush=True)


if __name__ == "__main__":
    main()
