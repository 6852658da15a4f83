"""The Python a step runs, counted rather than timed: bytecodes a step, gradscape's by module and by function.

    python bench/bytecodes.py                            # the GAN and forward-forward, traced, 20 steps
    python bench/bytecodes.py --loops gan,W1 --modes plain,monitor,traced --top 30

A loop is one of bench/loops.py's (`gan`, `forward_forward`, ...) or a workload of bench/workloads.py (`W1`,
`W6`, ...: one loss, `backward()`, SGD). Modes, after warm-up steps (as bench/loop_costs.py has them):

    plain     the step as the program runs it
    monitor   inside `with tr.step(i)` of a Tracer that never traces (every=10**9): the every-step monitor
    traced    inside `with tr.step(i)` of Tracer(model, every=1, tensors="summary"): every step traced
    unmonitored  the same with `monitor=False` (as `gradscape.trace` runs a step): the recorder's Python alone

Why count. On these machines a small step's time moves by ±5% between runs, more than most single changes to a
traced step's Python save, and a traced step's fixed cost is mostly its Python (docs/costs.md, "Counted, not
timed"). The count is the same on every run: the interpreter's opcodes (`sys.settrace` with `f_trace_opcodes`)
in each code object, with the Python calls made. Opcodes are not equal in cost, and C calls (torch's, the
extension's) count one each, so this is a map of where a step's Python is, not its time: the time is
bench/loop_costs.py's.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
for p in (str(BENCH_DIR), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
from loops import LOOPS, Loop  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

import gradscape  # noqa: E402

MODES = ("plain", "monitor", "traced", "unmonitored")
WARM = 20  # steps of each mode before counting (the carried forward, the monitor's sampler and caches settle)


def loop(key: str) -> Loop:
    """A loop of bench/loops.py, or a workload of bench/workloads.py stepped as one loss, `backward()` and SGD."""
    if key in LOOPS:
        return LOOPS[key]()
    wl = WORKLOADS[key]()
    batch = wl.batch()
    opt = torch.optim.SGD(wl.model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        wl.loss(wl.model, batch).backward()
        opt.step()

    return Loop(key, wl.model, step)


class Counts:
    """Opcodes and calls by code object, over the steps counted."""

    def __init__(self) -> None:
        self.ops: collections.Counter[Any] = collections.Counter()
        self.calls: collections.Counter[Any] = collections.Counter()

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.ops[frame.f_code] += 1
        return self._local

    def _global(self, frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        self.calls[frame.f_code] += 1
        return self._local

    def run(self, steps: Any) -> None:
        sys.settrace(self._global)
        try:
            steps()
        finally:
            sys.settrace(None)


def _ours(code: Any) -> str | None:
    """The repository's path of a code object of gradscape's (None for any other)."""
    path = Path(code.co_filename)
    if path.suffix != ".py":  # (`<string>`: code made at run time)
        return None
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        return None
    return None if rel.parts[0] in ("bench", "tests") or ".venv" in rel.parts[0] else str(rel)


def count(key: str, mode: str, steps: int) -> Counts:
    """The opcodes of `steps` steps of loop `key` in `mode`, after `WARM` steps."""
    lp = loop(key)
    every = 10**9 if mode == "monitor" else 1
    tr = None if mode == "plain" else gradscape.Tracer(lp.model, run=f"bytecodes-{key}", every=every, tensors="summary",
                                                        monitor=mode != "unmonitored")
    i = 0

    def run(n: int) -> None:
        nonlocal i
        for _ in range(n):
            if tr is None:
                lp.step()
            else:
                with tr.step(i):
                    lp.step()
            i += 1

    run(WARM)
    out = Counts()
    out.run(lambda: run(steps))
    if tr is not None:
        tr.close()
    return out


def report(key: str, mode: str, c: Counts, steps: int, top: int) -> list[str]:
    total = sum(c.ops.values())
    ours = {code: n for code, n in c.ops.items() if _ours(code) is not None}
    lines = [f"{key:16s} {mode:11s} {total / steps:9,.0f} bytecodes a step, gradscape's "
             f"{sum(ours.values()) / steps:9,.0f}; {sum(c.calls.values()) / steps:,.0f} Python calls"]
    if top and ours:
        by_module: collections.Counter[str] = collections.Counter()
        for code, n in ours.items():
            by_module[str(_ours(code))] += n
        lines += [f"    {n / steps:8,.0f}  {m}" for m, n in by_module.most_common(top)]
        lines.append("    --")
        for code, n in sorted(ours.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"    {n / steps:8,.0f}  {c.calls[code] / steps:5.1f}x  {_ours(code)}:{code.co_firstlineno}"
                         f"({code.co_name})")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loops", default="gan,forward_forward")
    ap.add_argument("--modes", default="traced")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=0, help="also the top modules and functions of gradscape's")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    print(f"torch {torch.__version__}, {args.steps} steps a row after {WARM}")
    for key in args.loops.split(","):
        if key not in LOOPS and key not in WORKLOADS:
            raise SystemExit(f"--loops: {key!r} is neither a loop of bench/loops.py nor a workload of "
                             "bench/workloads.py")
        for m in modes:
            print("\n".join(report(key, m, count(key, m, args.steps), args.steps, args.top)), flush=True)


if __name__ == "__main__":
    main()
