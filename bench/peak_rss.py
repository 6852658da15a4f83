"""The memory a training loop needs with gradscape, on the CPU: the process's peak resident memory over a
few steps, above what it held before its first step, plain and traced, each mode in a fresh process.

    python bench/peak_rss.py                                 # W1, W2, W3, the 10k-node loop; 4 steps each
    python bench/peak_rss.py --workloads lstm100000 --steps 4
    python bench/peak_rss.py --workloads lstm10000 --keep 1  # the memory sink keeping one step, not two

Modes (one child process each, started with default limits):

    plain    forward + loss + backward + SGD step + zero_grad, `--steps` times
    monitor  the same steps inside `with tr.step(i)` of Tracer(model, every=10**9): step 0 traced, the others
             untraced with the every-step monitor on
    traced   the same steps inside `with tr.step(i)` of Tracer(model, every=1, keep=--keep): every step traced,
             the last `keep` kept by the memory sink (`tr.steps`) and the last by `tr.last`

A child notes its resident memory (VmRSS) once the model and batch are made, runs its steps and reads the
high-water mark (VmHWM); `peak` is the difference, the memory the steps needed (activations, gradients, the
optimizer's state, and for the traced modes the tracer's tables and summary arena, and the steps it keeps).
`traced / plain` is the ratio of those peaks. Freed memory glibc keeps for reuse counts as resident, as it
does for any training process. Linux only (`/proc/self/status`); CUDA memory is `bench/overhead.py`'s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("plain", "monitor", "traced")
DEFAULT_WORKLOADS = "W1,W2,W3,lstm10000"


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def child(workload: str, mode: str, steps: int, keep: int) -> dict[str, float | int | str]:
    """Run `steps` steps of `mode` in this process; its memory figures (MiB)."""
    import torch

    torch.set_num_threads(1)
    import gradscape

    sys.path.insert(0, str(HERE))
    from workloads import build, lstm_loop

    wl = lstm_loop(int(workload[4:])) if workload.startswith("lstm") else build(workload)
    model, batch = wl.model, wl.batch()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tr = None if mode == "plain" else gradscape.Tracer(model, run="peak", every=1 if mode == "traced" else 10**9,
                                                       keep=keep)
    nodes = 0
    base = _status_kib("VmRSS")
    for i in range(steps):
        if tr is None:
            wl.loss(model, batch).backward()
        else:
            with tr.step(i) as st:
                wl.loss(model, batch).backward()
            nodes = len(st.nodes) if st is not None else nodes
        opt.step()
        opt.zero_grad()
    peak = _status_kib("VmHWM")
    return {"workload": workload, "mode": mode, "nodes": nodes, "peak": (peak - base) / 1024,
            "base": base / 1024, "end": (_status_kib("VmRSS") - base) / 1024}


def _run_child(workload: str, mode: str, steps: int, keep: int) -> dict[str, float | int | str]:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", workload, mode, str(steps),
                          str(keep)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                    help=f"comma-separated: W1..W10 or lstmN (an LSTMCell loop of about N nodes); "
                         f"default {DEFAULT_WORKLOADS}")
    ap.add_argument("--steps", type=int, default=4, help="steps a child runs (default 4)")
    ap.add_argument("--keep", type=int, default=2, help="the traced modes' `Tracer(keep=...)` (default 2)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        w, mode, steps, keep = args.child
        print(json.dumps(child(w, mode, int(steps), int(keep))))
        return 0
    if not Path("/proc/self/status").exists():
        print("peak_rss: needs Linux's /proc/self/status")
        return 1
    print(f"peak resident memory of {args.steps} steps above the process's memory before them (MiB); "
          f"traced keep={args.keep}")
    print(f"{'workload':<12} {'nodes':>7} {'plain':>9} {'monitor':>9} {'traced':>9}  "
          f"{'monitor/plain':>13} {'traced/plain':>12}  traced held at the end")
    for w in args.workloads.split(","):
        res = {m: _run_child(w, m, args.steps, args.keep) for m in MODES}
        plain = max(float(res["plain"]["peak"]), 1.0)
        print(f"{w:<12} {res['traced']['nodes']:>7} {res['plain']['peak']:>9.1f} {res['monitor']['peak']:>9.1f} "
              f"{res['traced']['peak']:>9.1f}  {float(res['monitor']['peak']) / plain:>12.2f}x "
              f"{float(res['traced']['peak']) / plain:>11.2f}x  {res['traced']['end']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
