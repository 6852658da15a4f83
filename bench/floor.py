"""The floor under a traced step: what a step would cost if all of gradscape's bookkeeping were gone.

    python bench/floor.py                          # W1, W6, W7; CPU, 1 thread; 15 rounds
    python bench/floor.py --workloads W1 --rounds 9 --steps 300
    python bench/floor.py --workloads gan,forward_forward   # loops of bench/loops.py: several backward calls

Modes, measured interleaved in one process (every round runs each mode for `--steps` steps, rotating
which goes first) and given as the median over rounds of the ratio to the plain step of the same round:

    plain    forward + loss + backward + SGD step + zero_grad (a loop of bench/loops.py: its own step, whatever
             backward calls and optimizers it has)
    norms    the torch calls of the every-step monitor, and nothing else: `Tensor.backward` wrapped to keep
             the loss, one fused norm of the gradients after the backward, one in an optimizer post-hook,
             two total norms, and the four reads of them to the host
    native   `norms` plus the native recorder's calls a traced step makes (a recorder, the walk and its
             arrays, a hook on each node, the stepped gradients summarised, the records and tables read,
             the hooks taken off; one recorder a step, each backward call walking and hooking the nodes it
             adds): the C++ side of a traced step with no Python bookkeeping around it
    bare     `native` without the norms: the extension's calls alone

The floor modes' backward wrapper and optimizer post-hook are put in place once for a mode's run of steps
(`Floor.installed`), so a step of them pays for the calls, not for installing them.
    traced   gradscape's own traced step (`Tracer(model, every=1)`), for comparison

`traced` minus `native` is what the step's Python bookkeeping costs (the recorder's objects, the pass's
start, the assembly, the problem finder, the monitor's row and triggers, the wrappers put in place and
taken off). A goal below `native` cannot be met while the monitor's norms are taken on every step; a goal
below `bare` cannot be met by any traced step that records the graph and its summaries.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import gradscape
from gradscape.tracer.record import native as native_recorder
from gradscape.tracer.record.tables import RUN_DTYPE
from gradscape.tracer.summary.summariser import Summariser

if __package__:  # imported as bench.floor (the tests), else run from the bench folder
    from .loops import LOOPS
    from .workloads import build
else:
    from loops import LOOPS
    from workloads import build

MODES = ("plain", "norms", "native", "bare", "traced")
RUN_SIZE = RUN_DTYPE.itemsize
_BACKWARD = torch.Tensor.backward


class Floor:
    """One workload's step in each mode (see the module's docstring)."""

    def __init__(self, key: str) -> None:
        self.ext = native_recorder._loaded()[0]
        if self.ext is None:
            raise SystemExit(f"the native recorder is not in use: {native_recorder.status()[1]}")
        if key in LOOPS:  # a loop of bench/loops.py, as its program steps
            loop = LOOPS[key]()
            self.model, self._step = loop.model, loop.step  # type: ignore[method-assign]
        else:
            self.wl = build(key)
            self.model, self.batch = self.wl.model, self.wl.batch()
            self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.params = list(self.model.parameters())
        self.by_id = {id(p): name for name, p in self.model.named_parameters()}
        self.tr = gradscape.Tracer(self.model, run=f"floor-{key}", every=1)
        self.summ = Summariser(self.tr.thumb, False)
        self.i = 0
        self.norms = self.native = False
        self.rec: Any = None
        self.passes = 0  # backward calls of the step so far
        self.kept: dict[str, torch.Tensor] = {}
        self.recorded = (0, 0)  # (nodes walked, node runs recorded) by the last `native` / `bare` step

    # ---- the pieces a monitored, natively traced step cannot do without
    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        if self.norms:
            self.kept["loss"] = loss.detach()
        if self.native:
            if self.rec is None:
                self.rec = self.ext.Recorder()
                self.rec.configure(self.summ.fallback, self.tr.thumb)
            rec, first = self.rec, int(self.rec.size())
            # the walk, the hooks, the parameters' names (into dicts of the step's own, as the native graph's)
            rec.start_call([loss.grad_fn], 0, (self.by_id, {}, {}, {}, {}))
            rec.graph(first)
            rec.begin_pass(self.passes)
        self.passes += 1
        _BACKWARD(loss, *args, **kwargs)
        if self.norms:
            with torch.no_grad():
                grads = [p.grad for p in self.params if p.grad is not None]
                self.kept["before"] = torch.stack(torch._foreach_norm(grads))

    def _stepped(self, opt: Any, args: Any, kwargs: Any) -> None:
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        if self.norms:
            with torch.no_grad():
                after = torch.stack(torch._foreach_norm(grads))
                self.kept["total_after"] = torch.linalg.vector_norm(after)
                self.kept["total_before"] = torch.linalg.vector_norm(self.kept["before"])
        if self.native and self.rec is not None:
            # the extension's summaries read the tensors' memory: no graph is made, grad mode or not
            self.rec.summarise(grads)

    def _step(self) -> None:
        loss = self.wl.loss(self.model, self.batch)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()

    def run(self, mode: str) -> None:
        """One step in `mode`; the floor modes' wrapper and hook are in place only inside `installed`."""
        if mode == "plain":
            self._step()
        elif mode == "traced":
            with self.tr.step(self.i):
                self._step()
            self.i += 1
        else:
            self._floor()

    @contextmanager
    def installed(self, mode: str) -> Iterator[None]:
        """For a floor mode, `Tensor.backward` wrapped and the optimizer post-hook registered for as long as the
        block runs (a run of steps): what each step then pays is the calls themselves, not putting them in
        place. (gradscape puts its wrappers and hooks in place for each step block and takes them off after it:
        NOTE [Monitor hooks] in tracer/monitor/installed.py. That is part of its bookkeeping, `traced` minus
        `native`, not of the floor.)"""
        if mode in ("plain", "traced"):
            yield
            return
        self.norms, self.native = mode in ("norms", "native"), mode in ("native", "bare")
        torch.Tensor.backward = lambda loss, *a, **k: self._backward(loss, *a, **k)  # type: ignore[method-assign]
        handle = register_optimizer_step_post_hook(self._stepped)
        try:
            yield
        finally:
            torch.Tensor.backward = _BACKWARD  # type: ignore[method-assign]
            handle.remove()

    def _floor(self) -> None:
        self.passes = 0
        self._step()
        if self.norms:
            for k in ("loss", "before", "total_after", "total_before"):
                self.kept[k].tolist()
        if self.native and self.rec is not None:
            rec, self.rec = self.rec, None
            rec.remove_hooks()
            runs = rec.records()[0]
            rec.tables()
            self.recorded = (rec.size(), len(runs) // RUN_SIZE)
            rec.release()


def _timed(floor: Floor, mode: str, n: int) -> float:
    """Seconds a step of `mode` takes, over `n` steps after an untimed one (the first after another mode's)."""
    with floor.installed(mode):
        floor.run(mode)
        t0 = time.perf_counter()
        for _ in range(n):
            floor.run(mode)
        return (time.perf_counter() - t0) / n


def measure(key: str, rounds: int, steps: int | None) -> tuple[dict[str, list[float]], float]:
    """Per mode, the ratio to the plain step of the same round, one per round (`steps` a mode runs a
    round; None: about 20 ms of plain steps); and a plain step's seconds."""
    floor = Floor(key)
    if steps is None:
        steps = max(10, int(0.02 / max(_timed(floor, "plain", 20), 1e-6)))
    for mode in MODES:  # warm-up
        _timed(floor, mode, max(5, steps // 10))
    ratios: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(rounds):
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
        secs = {m: _timed(floor, m, steps) for m in order}
        for m in MODES:
            ratios[m].append(secs[m] / secs["plain"])
    plain_s = _timed(floor, "plain", steps)
    floor.tr.close()
    return ratios, plain_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="W1,W6,W7",
                    help="comma-separated keys of bench/workloads.py, or names of bench/loops.py's loops")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=None, help="steps a mode runs a round (default: ~20 ms of plain)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}  threads {torch.get_num_threads()}  rounds {args.rounds}")
    print(f"{'workload':<16} {'plain ms':>9} " + " ".join(f"{m:>8}" for m in MODES[1:]))
    for key in args.workloads.split(","):
        res, plain_s = measure(key, args.rounds, args.steps)
        cells = " ".join(f"{statistics.median(res[m]):>7.2f}x" for m in MODES[1:])
        print(f"{key:<16} {plain_s * 1e3:>9.3f} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
