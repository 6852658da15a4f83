"""What gradscape costs on whole training steps (bench/loops.py: several backward calls, two optimizers,
a hand-written update, sparse matmul, transformers models, gradient accumulation), as ratios to the same
step run plain in the same process.

    python bench/loop_costs.py                         # every loop, 9 rounds
    python bench/loop_costs.py --loops gan,gpt_micro8 --rounds 15

Modes (after warm-up steps of each: two plain, three traced, and the monitor's own warm-up and two more; a step
of a mode's own Tracer each time):

    plain     the step as the program runs it
    monitor   inside `with tr.step(i)` of a Tracer that never traces (every=10**9): the every-step monitor
    traced    inside `with tr.step(i)` of Tracer(model, every=1, tensors="summary"): every step traced

Traced and plain steps are interleaved one by one (each round runs each mode once, rotating which goes first):
the traced ratio is the median of the rounds' (and their range). The monitor takes its norms on one step in k
(NOTE [Sampled norms] in tracer/monitor/sampling.py), so a median of single steps would leave those steps out:
its ratio is of whole blocks, the monitor's and the plain step's alternated `--rounds` times, each block about
0.1 s of steps (at least one), after a garbage collection (the process's first full one, the imports' objects,
would otherwise land in one of them): the ratio of the two modes' total times and its 95% interval (the blocks
resampled 400 times).

`--clock cpu` times the process's CPU time (`time.process_time`: every thread of the process, none of another's)
where the default, `wall`, times the wall clock (`time.perf_counter`): on a shared machine, the time another
process held the core is then not charged to whichever mode it fell in.

It prints per loop the plain step's median, the monitor's and the traced step's ratio, the traced step's cost
in ms above the plain one, its nodes and backward calls, and whether its forward was carried (NOTE [Carried
forwards] in tracer/record/carry.py). The gpt_micro rows are the micro-step curve: one step of k micro-batches,
k = 1, 2, 8, 40.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
for p in (str(BENCH_DIR), str(BENCH_DIR.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
from loops import LOOPS, Loop  # noqa: E402

import gradscape  # noqa: E402
from gradscape.tracer.monitor.sampling import WARMUP  # noqa: E402

MODES = ("plain", "monitor", "traced")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # `--clock`
BLOCK_SECONDS = 0.1  # a block of the monitor's (or the plain step's) measurement


class Timed:
    """One loop's three modes, each with its own Tracer, timed step by step."""

    def __init__(self, loop: Loop, clock: str = "wall") -> None:
        self.loop = loop
        self.clock = CLOCKS[clock]
        self.tracers = {"monitor": gradscape.Tracer(loop.model, run=f"{loop.name}-monitor", every=10 ** 9),
                        "traced": gradscape.Tracer(loop.model, run=f"{loop.name}-traced", every=1,
                                                   tensors="summary")}
        self.i = {m: 0 for m in MODES}
        self.times: dict[str, list[float]] = {m: [] for m in MODES}
        self.last: gradscape.StepTrace | None = None
        self.carried = False  # the last traced step's forward ran without the hooks and the mode


    def run(self, mode: str) -> float:
        self.i[mode] += 1
        carry = getattr(self.tracers["traced"], "_carry", None)  # private: what the next traced step will do
        ready = bool(carry is not None and carry.ready)
        t0 = self.clock()
        if mode == "plain":
            self.loop.step()
        else:
            with self.tracers[mode].step(self.i[mode]) as st:
                self.loop.step()
            if mode == "traced":
                self.last = st
                notes = st.meta.get("notes", []) if st is not None else []
                self.carried = ready and not any("NOTE [Carried forwards]" in n for n in notes)
        return self.clock() - t0

    def close(self) -> None:
        for tr in self.tracers.values():
            tr.close()


def measure(name: str, rounds: int, clock: str = "wall") -> str:
    timed = Timed(LOOPS[name](), clock)
    try:
        # warm-up: the first traced steps record their forward, then it is carried; the monitor's first
        # `WARMUP` steps all take the norms (NOTE [Sampled norms]): a run's first steps, not its steady state
        warm = {"plain": 2, "monitor": WARMUP + 2, "traced": 3}
        for mode in MODES:
            for _ in range(warm[mode]):
                timed.run(mode)
        ratios: list[float] = []
        for r in range(rounds):
            order = ("plain", "traced") if r % 2 == 0 else ("traced", "plain")
            got = {m: timed.run(m) for m in order}
            ratios.append(got["traced"] / got["plain"])
            for m in order:
                timed.times[m].append(got[m])
        st = timed.last
        plain = statistics.median(timed.times["plain"])
        extra = statistics.median(timed.times["traced"]) - plain
        carried = "yes" if timed.carried else "no"
        nodes = len(st.nodes) if st is not None else 0
        passes = len(st.passes) if st is not None else 0
        total, low, high = monitor_blocks(timed, rounds, max(1, round(BLOCK_SECONDS / plain)))
        monitor = f"{total:.3f}x [{low:.3f}-{high:.3f}]"
        traced = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        return (f"{name:16s} {plain * 1e3:9.2f} {monitor:>22s} {traced:>20s} {extra * 1e3:9.2f} "
                f"{nodes:7d} {passes:7d} {carried:>8s}")
    finally:
        timed.close()


def monitor_blocks(timed: Timed, blocks: int, steps: int) -> tuple[float, float, float]:
    """The monitor's total time over the plain step's, in `blocks` alternated blocks of `steps` steps each, and
    its 95% interval from the blocks resampled."""
    gc.collect()
    secs: dict[str, list[float]] = {"plain": [], "monitor": []}
    for b in range(blocks):
        for m in ("plain", "monitor") if b % 2 == 0 else ("monitor", "plain"):
            secs[m].append(sum(timed.run(m) for _ in range(steps)))
    rng = random.Random(0)
    picks = [[rng.randrange(blocks) for _ in range(blocks)] for _ in range(400)]
    boot = sorted(sum(secs["monitor"][k] for k in p) / sum(secs["plain"][k] for k in p) for p in picks)
    return sum(secs["monitor"]) / sum(secs["plain"]), boot[10], boot[389]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loops", default=",".join(LOOPS))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # transformers' notes on its configs
    torch.set_num_threads(1)  # one thread: the ratios are not each run's share of a busy machine's cores
    print(f"torch {torch.__version__}, one thread, {args.rounds} rounds, {args.clock} clock; "
          f"monitor: ratio of total times [95% interval] over {args.rounds} blocks of ~{BLOCK_SECONDS:g} s each; "
          "traced: median (range)")
    print(f"{'loop':16s} {'plain ms':>9s} {'monitor':>22s} {'traced':>20s} {'+ms':>9s} {'nodes':>7s} "
          f"{'passes':>7s} {'carried':>8s}")
    for name in args.loops.split(","):
        print(measure(name, args.rounds, args.clock), flush=True)


if __name__ == "__main__":
    main()
