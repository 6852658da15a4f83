"""The two recorders side by side: a traced step with `Tracer(recorder="native")` and with
`Tracer(recorder="python")`, each as a ratio to a plain step measured in the same run, interleaved.

    python bench/recorders.py                                  # W1, W3, a 1k-node LSTMCell loop; CPU
    python bench/recorders.py --device cuda --rounds 9         # the same on a GPU
    python bench/recorders.py --workloads W3,W9 --device cuda

A step is forward, backward, an Adam step and `zero_grad`, synchronised on CUDA. Each round runs one plain
step and one traced step of each recorder, in a rotating order; the figures are medians over rounds. The last
column names the recorder each Tracer's steps really used (the Python one, and why, where the native one is
not built).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from workloads import build, lstm_loop  # noqa: E402

import gradscape  # noqa: E402

RECORDERS = ("native", "python")


def _workload(key: str, device: str) -> Any:
    if key.startswith("lstm"):
        return lstm_loop(int(key[4:] or 1000), device=device)
    return build(key, device)


def _stepper(w: Any, device: str) -> Any:
    opt = torch.optim.Adam(w.model.parameters(), 1e-4)
    batch = w.batch()

    def step() -> None:
        w.loss(w.model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    return step


def measure(key: str, device: str, rounds: int) -> dict[str, Any]:
    """Median seconds of a plain step and of each recorder's traced step, and the recorder each really used."""
    w = _workload(key, device)
    step = _stepper(w, device)
    tracers = {r: gradscape.Tracer(w.model, run=f"{key}-{r}", every=1, tensors="summary", recorder=r)
               for r in RECORDERS}
    used: dict[str, str] = {}
    i = 0

    def traced(rec: str) -> None:
        nonlocal i
        i += 1
        with tracers[rec].step(i) as st:
            step()
        used[rec] = str(st.meta.get("recorder"))

    kinds: list[tuple[str, Any]] = [("plain", step)] + [(r, lambda r=r: traced(r)) for r in RECORDERS]
    for _, f in kinds * 3:  # warm: the kernels' plans, the carried forward, the allocator
        f()
    times: dict[str, list[float]] = {k: [] for k, _ in kinds}
    for r in range(rounds):
        for k, f in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    for tr in tracers.values():
        tr.close()
    return {"median": {k: statistics.median(v) for k, v in times.items()}, "used": used}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="W1,W3,lstm1000")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.device}, {args.rounds} rounds")
    print(f"{'workload':10s} {'plain ms':>9s} {'native':>8s} {'python':>8s}  recorder used")
    for key in args.workloads.split(","):
        m = measure(key, args.device, args.rounds)
        p = m["median"]["plain"]
        ratios = " ".join(f"{m['median'][r] / p:7.2f}x" for r in RECORDERS)
        print(f"{key:10s} {p * 1e3:9.2f} {ratios}  {m['used']}", flush=True)


if __name__ == "__main__":
    main()
