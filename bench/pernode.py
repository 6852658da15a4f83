"""gradscape's cost per autograd node: an `nn.LSTMCell` loop unrolled over time (hidden 32, batch 8),
the shape of graph that sequence models and RL rollouts build, where ops are small and many.

    python bench/pernode.py                      # the curve: 1k, 10k, 50k, 100k nodes
    python bench/pernode.py --nodes 1000,10000 --rounds 5
    python bench/pernode.py --profile 10000      # cProfile of one traced 10k-node step
    python bench/pernode.py --file 100000        # traced steps written to a trace file, one read back elsewhere

Modes, measured interleaved in the same process (a warm-up of one plain step and three traced steps of
each traced mode, so that the curve is of carried steps, `WARM_TRACED`; then every round runs each mode
once, rotating which goes first):

    plain    forward + loss + backward + SGD step + zero_grad
    traced   the same step inside `with tr.step(i)` of Tracer(model, every=1, tensors="summary"), recorded
             by the native recorder when it is built (`gradscape build-recorder`), else in Python
    python   (with --python) the traced step recorded by the Python recorder, to compare the two

Per size it prints the medians, the per-round ratio traced/plain (median and range) and the cost per
node, (traced - plain) / nodes in µs. `--file N` traces steps with the SQLite file sink (the graph's first,
then `--rounds` more, each after a plain step), then loads the last back in a fresh Python process started
with default limits (recursion limit, C stack), and prints the times as ratios to the plain steps, and the
traced steps' minor page faults (on a virtual machine a page first touched can cost a few µs to back: the
first step's spread from run to run follows them, not the code).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for p in (str(BENCH_DIR), str(REPO_ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
from memory import page_faults, page_size  # noqa: E402
from workloads import lstm_loop  # noqa: E402

import gradscape  # noqa: E402

DEFAULT_NODES = "1000,10000,50000,100000"


class Loop:
    """One LSTMCell loop of about `nodes` autograd nodes, with its optimizer and tracer."""

    def __init__(self, nodes: int, sink: object = None, device: str = "cpu") -> None:
        self.wl = lstm_loop(nodes, device)
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        self.model = self.wl.model
        self.batch = self.wl.batch()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.tr = gradscape.Tracer(self.model, sink=sink, every=1, tensors="summary")
        self.sink, self.py_tr = sink, None
        self.i = 0
        self.nodes = 0
        self.recorder = ""

    def step(self) -> None:
        loss = self.wl.loss(self.model, self.batch)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()

    def plain(self) -> tuple[float, float]:
        """(wall seconds, CPU seconds of this process) of one plain step."""
        self.sync()
        t0, c0 = time.perf_counter(), time.process_time()
        self.step()
        self.sync()
        return time.perf_counter() - t0, time.process_time() - c0

    def traced(self, tr: Any = None) -> tuple[float, float]:
        self.sync()
        t0, c0 = time.perf_counter(), time.process_time()
        with (tr or self.tr).step(self.i) as st:
            self.step()
        self.sync()
        dt = time.perf_counter() - t0, time.process_time() - c0
        self.i += 1
        assert st is not None
        self.nodes = len(st.nodes)
        self.recorder = st.meta.get("recorder", "")
        return dt

    def python(self) -> tuple[float, float]:
        """`traced` by a second Tracer of the model that records in Python (`Tracer(recorder="python")`)."""
        if self.py_tr is None:
            self.py_tr = gradscape.Tracer(self.model, sink=self.sink, every=1, tensors="summary", recorder="python")
        return self.traced(self.py_tr)


def _row(nodes: int, plain: list[float], traced: list[float]) -> str:
    ratios = [t / p for t, p in zip(traced, plain)]
    per = [(t - p) / nodes * 1e6 for t, p in zip(traced, plain)]
    return (f"{statistics.median(plain) * 1e3:>9.1f} {statistics.median(traced) * 1e3:>9.1f} "
            f"{statistics.median(ratios):>6.2f}x {min(ratios):>5.2f}–{max(ratios):<5.2f} "
            f"{statistics.median(per):>7.1f} {min(per):>6.1f}–{max(per):<6.1f}")


# Traced steps of a new graph before the curve's: the first works out what is kept per graph shape (labels,
# schemas), the first two record the forward with the hooks and the mode, and the third is the first carried one
# (NOTE [Carried forwards] in tracer/record/carry.py). A 1k-node loop's first three traced steps read 2.5x, 1.8x
# and 1.5x a plain step, the ones after 1.2-1.35x: the curve is of the steps a training loop makes after its
# first few. The first step of a graph is measured on its own by `--file`.
WARM_TRACED = 3


def curve(sizes: list[int], rounds: int, python: bool, device: str = "cpu") -> None:
    """Wall time, and the process's CPU time, which a loaded machine disturbs less (both modes run on
    one thread): median per mode, the per-round ratio (median, range) and µs per node (median, range)."""
    head = f"{'plain ms':>9} {'traced ms':>9} {'ratio':>7} {'range':>11} {'µs/node':>7} {'range':>13}"
    print(f"{'':>16} | {'wall':^61} | {'CPU time':^61}")
    print(f"{'nodes':>7} {'recorder':>8} | {head} | {head}")
    modes = ["plain", "traced", *(["python"] if python else [])]
    for n in sizes:
        loop = Loop(n, device=device)
        wall: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        who: dict[str, str] = {}  # the recorder that recorded each traced mode's steps
        for mode in modes:  # warm-up: a traced mode until its steps are carried (`WARM_TRACED`)
            for _ in range(1 if mode == "plain" else WARM_TRACED):
                getattr(loop, mode)()
        for r in range(rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                w, c = getattr(loop, mode)()
                wall[mode].append(w)
                cpu[mode].append(c)
                who[mode] = loop.recorder
        for mode in modes[1:]:
            print(f"{loop.nodes:>7} {who[mode]:>8} | {_row(loop.nodes, wall['plain'], wall[mode])} | "
                  f"{_row(loop.nodes, cpu['plain'], cpu[mode])}", flush=True)
        loop.tr.close()


def profile(n: int, top: int, device: str = "cpu") -> None:
    loop = Loop(n, device=device)
    loop.plain(), loop.traced()
    prof = cProfile.Profile()
    prof.enable()
    loop.traced()
    prof.disable()
    print(f"cProfile of one traced step of {loop.nodes} nodes (sorted by own time)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


_READ_BACK = """
import sys, time
import gradscape
t0 = time.perf_counter()
st = gradscape.load(sys.argv[1])
print(time.perf_counter() - t0, len(st.nodes), len(st.edges))
"""


def file_round_trip(n: int, rounds: int) -> None:
    """The first traced step of the graph (it computes what the tracer keeps per graph shape: labels,
    schemas) and `rounds` more, plain and traced steps in turn, each written to the file; then the last one
    read back in a fresh process."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.sqlite")
        loop = Loop(n, sink=path)
        loop.plain()
        plains = [loop.plain()[0]]
        f0 = page_faults()
        first = loop.traced()[0]
        faults = [page_faults() - f0]
        size = os.path.getsize(path) / 1e6
        later = []
        for _ in range(rounds):
            plains.append(loop.plain()[0])
            f0 = page_faults()
            later.append(loop.traced()[0])
            faults.append(page_faults() - f0)
        loop.tr.close()
        plains.append(loop.plain()[0])
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", _READ_BACK, path], capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            print(f"read-back process failed (exit {out.returncode}): {out.stderr[-2000:]}")
            return
        load_s, nodes, edges = out.stdout.split()
        plain = statistics.median(plains)
        ratios = [t / p for t, p in zip(later, plains[1:])]
        print(f"{loop.nodes} nodes: plain {plain * 1e3:.0f} ms (median of {len(plains)}); traced + written: the "
              f"graph's first step {first * 1e3:.0f} ms = {first / plain:.2f}x plain, the {rounds} after it "
              f"{statistics.median(later) * 1e3:.0f} ms = {statistics.median(ratios):.2f}x the plain step before each "
              f"(range {min(ratios):.2f}–{max(ratios):.2f}); {size:.0f} MB a step; read back in a fresh process "
              f"{float(load_s) * 1e3:.0f} ms ({wall:.1f} s with start-up) = {float(load_s) / plain:.2f}x plain, "
              f"{nodes} nodes and {edges} edges")
        if page_faults() >= 0:  # counted here (not on Windows); a VM's first touch of a page costs a few µs
            print(f"page faults of the traced steps: the first {faults[0]} ({faults[0] * page_size() / 1e6:.0f} MB), "
                  f"the {rounds} after it median {statistics.median(faults[1:]):.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default=DEFAULT_NODES, help=f"comma-separated graph sizes (default {DEFAULT_NODES})")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per size (default 5)")
    ap.add_argument("--python", action="store_true", help="also time the Python recorder, interleaved")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the loop runs (the curve, --profile)")
    ap.add_argument("--profile", type=int, metavar="N", help="cProfile one traced step of about N nodes")
    ap.add_argument("--top", type=int, default=30, help="rows of the profile (default 30)")
    ap.add_argument("--file", type=int, metavar="N", help="trace N-node steps to a file and read one back")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch.cuda.is_available() is False")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("error", message="gradscape", category=RuntimeWarning)
    print(f"torch {torch.__version__}  threads {torch.get_num_threads()}  "
          f"loadavg {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.profile:
        profile(args.profile, args.top, args.device)
    elif args.file:
        file_round_trip(args.file, args.rounds)
    else:
        curve([int(s) for s in args.nodes.split(",") if s.strip()], args.rounds, args.python, args.device)
    print(f"loadavg at end {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
