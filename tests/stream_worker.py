"""A real training loop streaming into a gradscape server; run by the server tests as a subprocess.
Prints one JSON line at the end: the sink's counts, the acknowledged steps and its timings."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from zoo import Case, build  # noqa: E402

import gradscape  # noqa: E402


def _lstm(nodes: int) -> Case:
    """`--model lstm:N`: bench/pernode.py's LSTMCell loop of about N autograd nodes, as a zoo case."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from workloads import lstm_loop

    wl = lstm_loop(nodes)
    return Case(wl.name, wl.model, wl.batch(), wl.loss)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--model", default="transformer", help="a zoo model, or lstm:N (an LSTMCell loop of ~N nodes)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--pause", type=float, default=0.0)
    ap.add_argument("--file", default=None, help="also write every step here (the reference copy)")
    ap.add_argument("--spill", default=None)
    ap.add_argument("--close-timeout", type=float, default=20.0)
    ap.add_argument("--recorder", default=None, choices=["native", "python"])
    args = ap.parse_args()
    case = _lstm(int(args.model[5:])) if args.model.startswith("lstm:") else build(args.model, args.device)
    sinks: list[object] = []
    from gradscape.tracer.sinks.socket import SocketSink

    net = SocketSink(args.url, args.run, spill=args.spill)
    sinks.append(net)
    if args.file:
        sinks.append(args.file)
    tr = gradscape.Tracer(case.model, run=args.run, sink=sinks, recorder=args.recorder)
    step_ms = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        with tr.step(i):
            case.loss(case.model, case.batch).backward()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        print(f"step {i}", flush=True)
        time.sleep(args.pause)
    tr.close(args.close_timeout)
    print(json.dumps({"stats": tr.stats, "acked": net.acked, "max_write_ms": net.max_write_ms,
                      "max_step_ms": max(step_ms), "median_step_ms": sorted(step_ms)[len(step_ms) // 2]}),
          flush=True)


if __name__ == "__main__":
    main()
