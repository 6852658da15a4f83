"""Where a light step's cost goes in the loop: each phase of a monitored step timed against the same phase of a
plain one (NOTE [Native light steps] in tracer/monitor/light_native.py).

    python bench/light_phases.py                       # W1, W6; CPU, 1 thread; 6 rounds of 2,000 steps a mode
    python bench/light_phases.py --workloads W6 --rounds 3 --steps 1000

Steps of the two modes alternate in runs of `--steps`, the order swapped every round, after a warm-up that
takes the monitor past its full steps and fills its history (`KEEP_ROWS`). The monitored steps are all light
(`Tracer(norms_every=10**9)`), so what is timed is the light step: its block's opening (`tr.step(i)` and
entering it), the loop's forward, backward (its loss read by the extension's front of `Tensor.backward`) and
optimizer step inside it, and its closing (which, once in a batch, lets the batch of rows join the history:
`Monitor.drain`, also timed on its own and given as its average a step). Printed per phase: the median over
every step of each mode, in µs. With `--floor`, a third mode: the same steps inside bench/light_floor.cpp's bare
C++ block, its wrapper of `Tensor.backward` reading the loss and nothing else (bench/light_floor.py's `native`).
A phase of the loop's own that is slower inside the block than outside shows what the monitor's code costs the
loop's calls around it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import gradscape
from gradscape.tracer.monitor.monitor import KEEP_ROWS
from gradscape.tracer.record import patched_calls

if __package__:  # imported as bench.light_phases (the tests), else run from the bench folder
    from .light_floor import load_native
    from .workloads import build
else:
    from light_floor import load_native
    from workloads import build

PHASES = ("open", "forward", "backward", "step", "close", "whole")


class Phases:
    """One workload's loop, its steps timed phase by phase, monitored (light) and plain."""

    def __init__(self, key: str, ext: Any = None) -> None:
        self.wl = build(key)
        self.model, self.batch = self.wl.model, self.wl.batch()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.tr = gradscape.Tracer(self.model, run=f"light-phases-{key}", every=10 ** 9, norms_every=10 ** 9)
        self.modes = ("monitor", "plain") if ext is None else ("monitor", "plain", "floor")
        self.times: dict[str, dict[str, list[float]]] = {m: {p: [] for p in PHASES} for m in self.modes}
        # bench/light_floor.cpp's block and its wrapper of `Tensor.backward`, in place only for the `floor` steps
        self.block = None if ext is None else ext.Block()
        self.wrapper = None if ext is None else ext.make_wrapper(patched_calls.original_of(torch.Tensor.backward))
        self.drained = 0.0  # seconds in the monitor's batches, over the timed monitored steps
        self.i = 0
        mon = self.tr._monitor
        drain = mon.drain

        def timed_drain() -> None:
            t0 = time.perf_counter()
            drain()
            self.drained += time.perf_counter() - t0

        mon.drain = timed_drain  # (this Tracer's own monitor only)

    def run(self, mode: str, n: int, keep: bool = True) -> None:
        """`n` steps of `mode` ("monitor", "plain" or "floor"), each phase's seconds kept when `keep`."""
        if mode != "floor":  # (the monitor's own wrappers stay as its steps leave them)
            self._run(mode, n, keep)
            return
        held = torch.Tensor.backward
        torch.Tensor.backward = self.wrapper  # type: ignore[method-assign]
        try:
            self._run(mode, n, keep)
        finally:
            torch.Tensor.backward = held  # type: ignore[method-assign]

    def _run(self, mode: str, n: int, keep: bool) -> None:
        pc, out = time.perf_counter, self.times[mode]
        for _ in range(n):
            self.i += 1
            t0 = pc()
            if mode == "plain":
                t1, t2, t3, t4 = self._body()
            else:
                with (self.tr.step(self.i) if mode == "monitor" else self.block):
                    t1, t2, t3, t4 = self._body()
            t5 = pc()
            if keep:
                for p, v in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0)):
                    out[p].append(v)

    def _body(self) -> tuple[float, float, float, float]:
        """The loop's step, the times before its forward, backward and optimizer step, and after."""
        pc = time.perf_counter
        t1 = pc()
        loss = self.wl.loss(self.model, self.batch)
        t2 = pc()
        loss.backward()
        t3 = pc()
        self.opt.step()
        self.opt.zero_grad()
        return t1, t2, t3, pc()


def measure(key: str, rounds: int, steps: int, warm: int = KEEP_ROWS + 500,
            ext: Any = None) -> tuple[dict[str, dict[str, float]], float]:
    """Per mode, each phase's median in µs; and the batches' µs a monitored step (after `warm` monitored steps;
    `ext`: bench/light_floor.cpp built, for the `floor` mode)."""
    ph = Phases(key, ext)
    try:
        # past the sampler's warm-up of full steps, and the history full: while its 10,000 rows fill, the objects they
        # add set off the garbage collector's full collections, which a steady loop does not see
        ph.run("monitor", warm, keep=False)
        for mode in ph.modes[1:]:
            ph.run(mode, max(300, steps // 4), keep=False)
        ph.drained = 0.0
        for r in range(rounds):
            for mode in (ph.modes if r % 2 == 0 else ph.modes[::-1]):
                ph.run(mode, steps)
        medians = {m: {p: statistics.median(v) * 1e6 for p, v in t.items()} for m, t in ph.times.items()}
        return medians, ph.drained / max(1, len(ph.times["monitor"]["whole"])) * 1e6
    finally:
        ph.tr.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="W1,W6", help="comma-separated keys of bench/workloads.py")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--floor", action="store_true", help="also the bare C++ block of bench/light_floor.cpp")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ext = load_native(Path(f".cache/bench-light-floor/{torch.__version__.replace('+', '_')}")) if args.floor else None
    print(f"torch {torch.__version__}  threads {torch.get_num_threads()}  rounds {args.rounds}  steps {args.steps}")
    print("median µs a phase: " + " / ".join(("monitored (light)", "plain", "floor")[:3 if args.floor else 2]))
    for key in args.workloads.split(","):
        med, drained = measure(key, args.rounds, args.steps, ext=ext)
        cells = [f"{p} " + " / ".join(f"{med[m][p]:.2f}" for m in med) for p in PHASES]
        print(f"{key:<6} " + "  ".join(cells) + f"  batches {drained:.2f} a step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
