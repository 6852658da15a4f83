"""Machine instructions a step, counted by valgrind's callgrind: the same on every run, where a small step's time
on a shared machine is not.

    python bench/instructions.py                                   # W1: plain, monitor, light; 2,000 steps
    python bench/instructions.py --loops gan --modes plain,traced --steps 500

A loop is one of bench/loops.py's or a workload of bench/workloads.py, stepped as bench/bytecodes.py steps it.
Modes (each after `WARM` steps of its own, then a garbage collection):

    plain     the step as the program runs it, a monitoring Tracer alive but never entered (its wrappers held in
              place: NOTE [Fronts] in tracer/record/patched_calls.py), as bench/overhead.py's plain step
    monitor   inside `with tr.step(i)` of Tracer(model, every=10**9): the every-step monitor, its sampled full steps
    light     the same with `norms_every=10**6`: after the monitor's first steps, light steps only
    traced    inside `with tr.step(i)` of Tracer(model, every=1, tensors="summary"): every step traced

Each mode runs under `valgrind --tool=callgrind` twice, in processes of their own: `BASE` steps, then `BASE` +
`--steps`. The difference of the two totals over `--steps` is the mode's instructions a step: the interpreter's
start, the imports and the warm-up cancel out, and each process leaves by `os._exit`, so no teardown is counted
(the objects a run kept would otherwise be freed in it). Printed: each mode's instructions a step and its ratio to
the plain mode's.

Instructions are not time. Code that runs once in many steps (the monitor's full steps, a batch of its light rows)
runs colder than the loop's and costs more time an instruction (NOTE [Sampled norms] in
tracer/monitor/sampling.py counts that), so a mode's instruction ratio is a lower bound of its time ratio, and a
change's instructions are the measure of what it removed. Under callgrind every step is about fifty times slower,
so the monitor's sampler, which chooses its k from measured times, may choose another k than in a timed run: it
is printed. Each run starts torch under valgrind: about five minutes a process on these machines.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
for p in (str(BENCH_DIR), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

MODES = ("plain", "monitor", "light", "traced")
WARM = 100  # steps before counting: the carried forward, the monitor's first full steps and its sampler settle
BASE = 100  # steps of the shorter run, whose total is taken off the longer one's


def run_steps(key: str, mode: str, steps: int) -> None:
    """`WARM` + `steps` steps of `mode` in this process, then the sampler's k printed and `os._exit(0)`."""
    import torch
    from bytecodes import loop

    import gradscape

    torch.set_num_threads(1)
    lp = loop(key)
    held = gradscape.Tracer(lp.model, run=f"instructions-{key}", every=1 if mode == "traced" else 10 ** 9,
                            tensors="summary", norms_every=10 ** 6 if mode == "light" else None)
    tr = None if mode == "plain" else held
    for i in range(WARM + steps):
        if tr is None:
            lp.step()
        else:
            with tr.step(i):
                lp.step()
        if i == WARM - 1:
            gc.collect()
    monitor = getattr(tr, "_monitor", None)  # private: the k its sampler chose
    print(f"k {getattr(getattr(monitor, 'sampler', None), 'k', '-')}", flush=True)
    os._exit(0)


def counted(key: str, mode: str, steps: int, folder: Path) -> tuple[int, str]:
    """The instructions of one process running `steps` steps of `mode` under callgrind, and its sampler's k."""
    out = folder / f"callgrind.{key}.{mode}.{steps}.out"
    proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                           str(Path(__file__).resolve()), "--inner", key, mode, str(steps)],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    total = re.search(r"Collected : (\d+)", proc.stderr)
    k = re.search(r"^k (\S+)", proc.stdout, re.M)
    if proc.returncode != 0 or total is None:
        raise RuntimeError(f"callgrind on {key} {mode} {steps} failed: {proc.stderr[-2000:]}")
    return int(total.group(1)), k.group(1) if k else "-"


def per_step(key: str, mode: str, steps: int, folder: Path) -> tuple[float, str]:
    """Instructions a step of `mode` (the two runs' difference over `steps`), and the longer run's k."""
    short, _ = counted(key, mode, BASE, folder)
    long, k = counted(key, mode, BASE + steps, folder)
    return (long - short) / steps, k


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 5 and sys.argv[1] == "--inner":
        run_steps(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loops", default="W1", help="comma-separated loops of bench/loops.py or workloads (W1, ...)")
    ap.add_argument("--modes", default="plain,monitor,light", help=f"a comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES) or args.steps < 1:
        ap.error(f"--modes is a subset of {','.join(MODES)}, --steps at least 1")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install -y valgrind)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.loops.split(","):
            got = {m: per_step(key, m, args.steps, Path(tmp)) for m in dict.fromkeys(["plain", *modes])}
            plain = got["plain"][0]
            for m in modes:
                n, k = got[m]
                print(f"{key:16s} {m:8s} {n:12,.0f} instructions a step  {n / plain:.4f}x plain  (k {k})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
