"""The first traced step of a fresh process (LeNet from bench/workloads.py): what a user waits for
before the first trace appears.

Each round runs in a new Python process with an empty cache directory (XDG_CACHE_HOME), so nothing
from an earlier run is reused. In that process: one plain training step (torch's own first-call
costs, paid by any training loop), then the first step traced by a fresh Tracer, then a second plain
step (warm). Printed: the first traced step in ms, the warm plain step, and their ratio; the median
over rounds.

    python bench/first_step.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, time
sys.path.insert(0, {bench!r})
import torch
import gradscape
import workloads

torch.set_num_threads(1)
w = workloads.lenet()
model, batch = w.model, w.batch()

def step():
    model.zero_grad(set_to_none=True)
    w.loss(model, batch).backward()

t0 = time.perf_counter(); step(); plain_cold = time.perf_counter() - t0
tr = gradscape.Tracer(model, every=1)
t0 = time.perf_counter()
with tr.step(0):
    step()
first = time.perf_counter() - t0
t0 = time.perf_counter(); step(); plain = time.perf_counter() - t0
tr.close()
from gradscape.tracer.summary.kernel import summariser
print(json.dumps({{"plain_cold": plain_cold, "first_traced": first, "plain": plain, "summariser": summariser()}}))
"""


def one_round() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache, "PYTHONPATH": str(ROOT)}
        res = subprocess.run([sys.executable, "-c", _CHILD.format(bench=str(ROOT / "bench"))], env=env,
                             capture_output=True, text=True, timeout=300, check=True)
        return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rows = [one_round() for _ in range(args.rounds)]
    for r in rows:
        print(f"first traced step {r['first_traced'] * 1e3:8.1f} ms   warm plain step {r['plain'] * 1e3:6.2f} ms   "
              f"ratio {r['first_traced'] / r['plain']:7.1f}x   summariser {r['summariser']}")
    first = statistics.median(r["first_traced"] for r in rows)
    ratio = statistics.median(r["first_traced"] / r["plain"] for r in rows)
    print(f"median over {len(rows)} fresh processes: first traced step {first * 1e3:.1f} ms, "
          f"{ratio:.1f}x a warm plain step")


if __name__ == "__main__":
    main()
