"""The floor under a light step: what the every-step monitor's light step (NOTE [Light steps] in
tracer/monitor/light.py) would cost the loop if its block and its capture of the backward call were C++.

    python bench/light_floor.py                          # W1, W6; CPU, 1 thread; 9 rounds of 2,000 steps
    python bench/light_floor.py --workloads W1 --rounds 3 --steps 500

Modes, interleaved in one process (every round runs each mode for `--steps` steps, rotating which goes first) and
given as the median over rounds of the ratio to the plain step of the same round:

    plain    forward + loss + backward + SGD step + zero_grad, a monitored Tracer alive (its wrappers held)
    native   the same inside a block of bench/light_floor.cpp, built here: a C++ context, and a C++ wrapper of
             `Tensor.backward` that reads the loss (`item`) and hands the call to torch's own function
    row      `native` and, after each block, a Python tuple kept: the step, its loss, the learning rate
    python   gradscape's monitor with its light steps in Python (`light_native.ENABLED` off as its Tracer was made)
    monitor  gradscape's monitor: `Tracer(model, every=10**9)`, its light steps (the extension's block, NOTE
             [Native light steps] in tracer/monitor/light_native.py) and its sampled full ones

`native` is what the block and the capture cost at the least; `row` adds the Python a row needs at the least.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import subprocess
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

import gradscape
from gradscape.tracer.monitor import light_native
from gradscape.tracer.record import native_build, patched_calls

if __package__:  # imported as bench.light_floor (the tests), else run from the bench folder
    from .workloads import build
else:
    from workloads import build

MODES = ("plain", "native", "row", "python", "monitor")
SOURCE = Path(__file__).with_name("light_floor.cpp")


def load_native(folder: Path) -> Any:
    """bench/light_floor.cpp built into `folder` with the native recorder's compiler command, and imported."""
    out = folder / f"light_floor{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if not out.exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(native_build.command(out, SOURCE), check=True, capture_output=True)
    spec = importlib.util.spec_from_file_location("light_floor", out)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class LightFloor:
    """One workload's step in each mode (see the module's docstring)."""

    def __init__(self, key: str, ext: Any) -> None:
        self.wl = build(key)
        self.model, self.batch = self.wl.model, self.wl.batch()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.tr = gradscape.Tracer(self.model, run=f"light-floor-{key}", every=10 ** 9)
        light_native.ENABLED = False
        try:
            self.tr_py = gradscape.Tracer(self.model, run=f"light-floor-{key}-python", every=10 ** 9)
        finally:
            light_native.ENABLED = True
        self.wrapper = ext.make_wrapper(patched_calls.original_of(torch.Tensor.backward))
        self.block = ext.Block()
        self.rows: list[tuple[int, float, Any]] = []
        self.i = 0

    def _step(self) -> torch.Tensor:
        loss = self.wl.loss(self.model, self.batch)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss

    def run(self, mode: str, n: int) -> list[torch.Tensor]:
        """`n` steps of `mode`; the losses of the last (a `native` or `row` run's, as the block read them too)."""
        swapped = mode in ("native", "row")  # (only then: the monitor's own wrapper stays as its steps left it)
        held = torch.Tensor.backward
        if swapped:
            torch.Tensor.backward = self.wrapper  # type: ignore[method-assign]
        losses = []
        try:
            for _ in range(n):
                self.i += 1
                if mode == "plain":
                    losses = [self._step()]
                elif mode in ("monitor", "python"):
                    with (self.tr if mode == "monitor" else self.tr_py).step(self.i):
                        losses = [self._step()]
                else:
                    with self.block:
                        losses = [self._step()]
                    if mode == "row":
                        self.rows.append((self.i, self.block.losses[0], self.opt.param_groups[0]["lr"]))
                        if len(self.rows) >= 32:
                            self.rows.clear()
        finally:
            if swapped:
                torch.Tensor.backward = held  # type: ignore[method-assign]
        return losses


def measure(floor: LightFloor, rounds: int, steps: int) -> dict[str, list[float]]:
    """Per mode, the ratio to the plain step of the same round, one per round."""
    for mode in MODES:  # warm-up (the monitor's first steps are full)
        floor.run(mode, max(20, steps // 10))
    gc.collect()  # (the process's first full collection, the imports' objects, would land in one mode's round)
    ratios: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(rounds):
        secs = {}
        for m in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
            t0 = time.perf_counter()
            floor.run(m, steps)
            secs[m] = time.perf_counter() - t0
        for m in MODES:
            ratios[m].append(secs[m] / secs["plain"])
    return ratios


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="W1,W6", help="comma-separated keys of bench/workloads.py")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--build", default=None, help="the folder the C++ block is built in (default: "
                    ".cache/bench-light-floor/<torch release>)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ext = load_native(Path(args.build or f".cache/bench-light-floor/{torch.__version__.replace('+', '_')}"))
    print(f"torch {torch.__version__}  threads {torch.get_num_threads()}  rounds {args.rounds}  steps {args.steps}")
    print(f"{'workload':<10} " + " ".join(f"{m:>8}" for m in MODES[1:]))
    for key in args.workloads.split(","):
        floor = LightFloor(key, ext)
        res = measure(floor, args.rounds, args.steps)
        floor.tr.close()
        floor.tr_py.close()
        print(f"{key:<10} " + " ".join(f"{statistics.median(res[m]):>7.3f}x" for m in MODES[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
