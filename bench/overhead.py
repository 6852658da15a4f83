"""Overhead of gradscape's tracer on a full training step, per workload.

    python bench/overhead.py                      # W1..W10, CPU, 1 thread; 41 rounds of a step under 50 ms, else 5
    python bench/overhead.py --quick              # W1..W3, 2 rounds
    python bench/overhead.py --workloads W3 --rounds 9 --device cuda
    python bench/overhead.py --workloads W1 --profile  # cProfile of traced steps instead of timings

Modes, measured interleaved in the same process (one warm-up round, then every round runs every mode
once, rotating which mode goes first; a short step is repeated and preceded by one untimed step):

    plain     forward + loss + backward + SGD step + zero_grad (the other modes' Tracers alive: the backward
              functions' fronts in place, NOTE [Fronts] in tracer/record/patched_calls.py; docs/costs.md counts
              what that costs a plain step against a process without gradscape)
    traced    the same step inside `with tr.step(i)` of Tracer(model, every=1, tensors="summary")
    untraced  the same step inside `with tr10.step(i)` of Tracer(model, every=10, monitor=False), i % 10 != 0
    monitor   the same step inside `with trm.step(i)` of Tracer(model, every=10**9): untraced, the every-step
              monitor on (its history row, triggers armed; a full step with its fused gradient norms every k-th
              step, light steps between: NOTE [Light steps] in tracer/monitor/light.py)
    triggered the same step traced because a trigger fired (grad_spike, noted as the previous step's):
              a monitor step plus the trace, as a step that goes wrong costs
    nofinder  (with --finder) `traced`, the problem finder off (`gradscape.tracer.record.debug.problems.enabled`),
              to show what the finder itself costs on a finite step

Ratios are taken per round (traced_r / plain_r) and the median of those is reported, which holds up
better than a ratio of medians when the machine drifts. `--clock cpu` times the process's CPU time
(`time.process_time`) instead of the wall clock: the time another process held the core is not counted.
"""

from __future__ import annotations

import argparse
import cProfile
import math
import os
import platform
import pstats
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for p in (str(BENCH_DIR), str(REPO_ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
from finder_clock import FinderClock  # noqa: E402
from memory import page_faults, steady_malloc  # noqa: E402
from workloads import WORKLOADS, Workload, build  # noqa: E402

import gradscape  # noqa: E402
import gradscape.tracer.record.debug.problems as problem_finder  # noqa: E402

MODES: tuple[str, ...] = ("plain", "traced", "untraced", "monitor", "triggered")
FINDER_MODES = (*MODES, "nofinder")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # `--clock`
DEFAULT_ROUNDS = 5
SHORT_STEP_ROUNDS = 41  # a step under 50 ms: 41 rounds take a few seconds. On a shared 2-core VM the
# median still moves between runs (W2: 1.18-1.47x in one afternoon), more than within one: compare
# several runs, and the quartiles printed with each ratio
QUICK_WORKLOADS = "W1,W2,W3"
QUICK_ROUNDS = 2


@dataclass
class Result:
    key: str
    name: str
    nodes: int
    times: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in FINDER_MODES})
    rounds: int = 0
    ratios: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in FINDER_MODES[1:]})
    finder_us: float = 0.0  # time inside the problem finder per traced step (--finder)
    peak: dict[str, int] = field(default_factory=dict)  # CUDA: bytes allocated at the peak of one step, per mode
    faults: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in FINDER_MODES})  # a step's, per round

    def median(self, mode: str) -> float:
        return statistics.median(self.times[mode])

    def ratio(self, mode: str) -> float:
        return statistics.median(self.ratios[mode])

    def spread(self, mode: str) -> str:
        """The per-round ratios' quartiles, as `q1–q3`."""
        r = self.ratios[mode]
        if len(r) < 4:
            return f"{min(r):.2f}–{max(r):.2f}" if r else "n/a"
        q1, _, q3 = statistics.quantiles(r, n=4)
        return f"{q1:.2f}–{q3:.2f}"


class Runner:
    """Runs one workload's training step in each mode and times it."""

    def __init__(self, wl: Workload, device: str, clock: str = "wall") -> None:
        self.clock = CLOCKS[clock]
        self.wl = wl
        self.device = device
        self.model = wl.model
        self.batch = wl.batch()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.tr = gradscape.Tracer(self.model, run=f"bench-{wl.name}", every=1, tensors="summary")
        self.tr10 = gradscape.Tracer(self.model, run=f"bench-{wl.name}-every10", every=10, monitor=False)
        self.trm = gradscape.Tracer(self.model, run=f"bench-{wl.name}-monitor", every=10 ** 9)
        cfg = gradscape.Triggers(cap=10 ** 9, cooldown=0)
        self.trt = gradscape.Tracer(self.model, run=f"bench-{wl.name}-triggered", every=10 ** 9, triggers=cfg)
        self.monitor_i = self.triggered_i = self.traced_i = self.untraced_i = self.last_nodes = 0
        self.faults = 0.0  # of the last `time`

    def close(self) -> None:
        for tr in (self.tr, self.tr10, self.trm, self.trt):
            tr.close()

    def _train_step(self) -> None:
        loss = self.wl.loss(self.model, self.batch)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()

    def plain(self) -> None:
        self._train_step()

    def traced(self) -> None:
        i = self.traced_i
        self.traced_i += 1
        with self.tr.step(i) as st:
            self._train_step()
        if st is None:
            raise RuntimeError(f"every=1 tracer did not trace step {i}")
        self.last_nodes = int(st.meta.get("nodes", len(st.nodes)))

    def nofinder(self) -> None:
        problem_finder.enabled = False
        try:
            self.traced()
        finally:
            problem_finder.enabled = True

    def untraced(self) -> None:
        self.untraced_i += 1
        if self.untraced_i % 10 == 0:
            self.untraced_i += 1
        i = self.untraced_i
        with self.tr10.step(i) as st:
            self._train_step()
        if st is not None:
            raise RuntimeError(f"every=10 tracer traced step {i}")

    def monitor(self) -> None:
        self.monitor_i += 1
        with self.trm.step(self.monitor_i) as st:
            self._train_step()
        if st is not None:
            raise RuntimeError(f"the monitor traced step {self.monitor_i}")

    def triggered(self) -> None:
        self.triggered_i += 1
        i = self.triggered_i
        # as if step i - 1 had spiked (what `grad_spike` leaves for the next step)
        spike = {"step": i - 1, "grad_norm": 100.0, "median": 1.0, "threshold": 2.0}
        self.trt._monitor.triggers.pending = ("grad_spike", i - 1, spike)  # type: ignore[union-attr]
        with self.trt.step(i) as st:
            self._train_step()
        if st is None or st.trigger != "grad_spike":
            raise RuntimeError(f"the trigger did not trace step {i}")

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def time(self, mode: str, reps: int = 1) -> float:
        """Mean seconds per step over `reps` consecutive steps of one mode. When steps are short
        enough to be repeated, one untimed step of the mode goes first: what the previous mode left
        behind (caches, the garbage collector's counts) would otherwise be charged to this one, and
        with the modes rotated, the mode measured after `traced` would pay most often."""
        fn: Callable[[], None] = getattr(self, mode)
        if reps > 1:
            fn()
        self._sync()
        f0, t0 = page_faults(), self.clock()
        for _ in range(reps):
            fn()
        self._sync()
        self.faults = (page_faults() - f0) / reps  # minor page faults a step (bench/memory.py)
        return (self.clock() - t0) / reps

    def peak_bytes(self, mode: str) -> int:
        """CUDA memory allocated at the peak of one step of `mode`, above what was there before it."""
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        getattr(self, mode)()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base


def run_workload(key: str, rounds: int, device: str, modes: tuple[str, ...] = MODES, clock: str = "wall") -> Result:
    wl = build(key, device)
    runner = Runner(wl, device, clock)
    try:
        for mode in modes:  # warm-up round, not recorded
            runner.time(mode)
        # small steps are repeated within a round, so each measurement spans >= ~50 ms of work
        plain = runner.time("plain")
        reps = max(1, min(200, math.ceil(0.05 / max(plain, 1e-6))))
        if rounds == 0:  # the default: rounds are cheap for short steps, and short steps are the noisy ones
            rounds = SHORT_STEP_ROUNDS if plain < 0.05 else DEFAULT_ROUNDS
        res = Result(key, wl.name, runner.last_nodes)
        res.rounds = rounds
        for r in range(rounds):
            k = r % len(modes)
            order = modes[k:] + modes[:k]
            t = {}
            for mode in order:
                t[mode] = runner.time(mode, reps)
                res.faults[mode].append(runner.faults)
            for mode in modes:
                res.times[mode].append(t[mode])
                if mode != "plain":
                    res.ratios[mode].append(t[mode] / t["plain"])
        res.nodes = runner.last_nodes
        if device == "cuda":
            res.peak = {mode: runner.peak_bytes(mode) for mode in modes}
        return res
    finally:
        runner.close()


def profile_workload(key: str, device: str, top: int) -> None:
    """cProfile of traced steps of one workload (after a warm-up of each mode), as many as fill ~1 s of
    plain steps, sorted by own time and by cumulative time."""
    wl = build(key, device)
    runner = Runner(wl, device)
    try:
        for mode in MODES:
            runner.time(mode)
        steps = max(1, min(500, math.ceil(1.0 / max(runner.time("plain"), 1e-6))))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            runner.traced()
        prof.disable()
    finally:
        runner.close()
    print(f"{key} {wl.name}: cProfile of {steps} traced steps ({runner.last_nodes} nodes each)")
    for order in ("tottime", "cumulative"):
        pstats.Stats(prof).sort_stats(order).print_stats(top)


def context_lines(device: str, threads: int, rounds: int, keys: list[str]) -> list[str]:
    dev = device
    if device == "cuda":
        dev = f"cuda ({torch.cuda.get_device_name(0)})"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"gradscape tracer overhead  (tracer {gradscape.__version__})",
        f"torch {torch.__version__}  python {platform.python_version()}  {platform.machine()}  "
        f"cpus {os.cpu_count()}",
        f"device {dev}  threads {threads} (torch.get_num_threads()={torch.get_num_threads()})",
        f"loadavg {load}",
        f"workloads {','.join(keys)}  rounds {rounds or f'{SHORT_STEP_ROUNDS} (steps < 50 ms) or {DEFAULT_ROUNDS}'} "
        f"(+1 warm-up), modes interleaved & rotated",
    ]


HEADER = (f"{'workload':<12} {'nodes':>6} {'plain s':>10} {'traced s':>10} {'untraced s':>11} "
          f"{'traced/plain':>13} {'untraced/plain':>15} {'monitor/plain':>14} {'triggered/plain':>16}")


def table_row(res: Result) -> str:
    return (f"{res.key + ' ' + res.name:<12} {res.nodes:>6} {res.median('plain'):>10.5f} "
            f"{res.median('traced'):>10.5f} {res.median('untraced'):>11.5f} "
            f"{res.ratio('traced'):>12.2f}x {res.ratio('untraced'):>14.2f}x {res.ratio('monitor'):>13.3f}x "
            f"{res.ratio('triggered'):>15.2f}x  ({res.rounds} rounds)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=None,
                    help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all; "
                         f"{QUICK_WORKLOADS} with --quick)")
    ap.add_argument("--rounds", type=int, default=None,
                    help=f"timed rounds per workload (default {DEFAULT_ROUNDS}, {SHORT_STEP_ROUNDS} for steps "
                         f"under 50 ms; {QUICK_ROUNDS} with --quick)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="wall: time.perf_counter; cpu: the "
                    "process's CPU time (time.process_time)")
    ap.add_argument("--finder", action="store_true",
                    help="also time the traced step with the problem finder off (mode nofinder)")
    ap.add_argument("--profile", action="store_true",
                    help="instead of timing, print a cProfile of traced steps of each workload")
    ap.add_argument("--top", type=int, default=30, help="rows of each --profile table (default 30)")
    ap.add_argument("--steady-malloc", action="store_true",
                    help="fix glibc's mmap and trim thresholds first (bench/memory.py)")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_ROUNDS} rounds of {QUICK_WORKLOADS} unless given explicitly")
    args = ap.parse_args(argv)
    if args.workloads is None:
        args.workloads = QUICK_WORKLOADS if args.quick else ",".join(WORKLOADS)
    if args.rounds is None:
        args.rounds = QUICK_ROUNDS if args.quick else 0  # 0: chosen per workload (run_workload)
    elif args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    keys = [k.strip().upper() for k in args.workloads.split(",") if k.strip()]
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown or not keys:
        ap.error(f"unknown workloads {unknown}; choose from {','.join(WORKLOADS)}")
    args.keys = keys
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch.cuda.is_available() is False")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    # A tracer that cannot assemble a step only warns; in a benchmark that must be loud.
    warnings.filterwarnings("error", message="gradscape", category=RuntimeWarning)
    heap = steady_malloc() if args.steady_malloc else "the allocator's defaults (--steady-malloc to hold glibc's heap)"
    for line in [*context_lines(args.device, args.threads, args.rounds, args.keys), f"malloc: {heap}",
                 f"clock: {args.clock}"]:
        print(line)
    print()
    if args.profile:
        for key in args.keys:
            profile_workload(key, args.device, args.top)
        return 0
    print(HEADER)
    print("-" * len(HEADER), flush=True)
    results = []
    for key in args.keys:
        clock = FinderClock() if args.finder else None
        try:
            res = run_workload(key, args.rounds, args.device, FINDER_MODES if args.finder else MODES, args.clock)
        finally:
            if clock is not None:
                clock.close()
        if clock is not None:
            res.finder_us = clock.per_step_us()
        results.append(res)
        print(table_row(res), flush=True)
    print()
    for res in results:
        print(f"{res.key} {res.name}: traced/plain {res.ratio('traced'):.2f}x (rounds {res.spread('traced')})  "
              f"every10-untraced/plain {res.ratio('untraced'):.2f}x (rounds {res.spread('untraced')})  "
              f"monitor-only/plain {res.ratio('monitor'):.3f}x (rounds {res.spread('monitor')})  "
              f"triggered/plain {res.ratio('triggered'):.2f}x (rounds {res.spread('triggered')})")
        if page_faults() >= 0:  # counted here (not on Windows)
            print(f"{res.key} {res.name}: minor page faults a step (median of the rounds): " + ", ".join(
                f"{mode} {statistics.median(f):.0f}" for mode, f in res.faults.items() if f))
        if res.ratios["nofinder"]:
            print(f"{res.key} {res.name}: traced, problem finder off/plain {res.ratio('nofinder'):.2f}x "
                  f"(rounds {res.spread('nofinder')}); finder on/off "
                  f"{statistics.median(a / b for a, b in zip(res.times['traced'], res.times['nofinder'])):.3f}x; "
                  f"inside the finder {res.finder_us:.0f} us per traced step = "
                  f"{res.finder_us / 1e6 / res.median('plain'):.2%} of the plain step")
        if res.peak:
            plain = max(res.peak["plain"], 1)
            print(f"{res.key} {res.name}: CUDA peak memory of one step above its start: " + ", ".join(
                f"{mode} {b / 2 ** 20:.1f} MiB ({b / plain:.2f}x)" for mode, b in res.peak.items()))
    print(f"loadavg at end {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
