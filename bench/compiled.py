"""A compiled GPT-6 under gradscape: each kind of step against a plain compiled step.

    python bench/compiled.py                    # inductor, 7 rounds, CPU, 1 thread
    python bench/compiled.py --backend aot_eager --rounds 3
    python bench/compiled.py --rounds 25 --modes monitor   # the monitor alone against plain

The model is W3's GPT (bench/workloads.py) with 6 layers at small dimensions (d=64, 4 heads, seq 32,
batch 8, vocab 256), so that inductor compiles it in minutes on a small machine; `torch.compile(model)`.
Modes, interleaved per round as bench/overhead.py does (`Runner.time`), each a step of forward, loss,
backward, SGD step and zero_grad:

    plain         the compiled step, no gradscape
    monitor       the compiled step inside `tr.step(i)` of Tracer(every=10**9): untraced, the monitor on
    traced        a traced step of the compiled model: run eagerly (NOTE [Compiled regions on a traced step])
    eager_traced  a traced step of the uncompiled model, what `traced` is compared with
    eager_plain   the uncompiled step, no gradscape (what compiling saves)
    compare       `tr.compare_compiled(i, closure)` then the SGD step: the compiled run and the traced eager one
    replayed      a step whose loss is NaN (the loss times NaN), so the `nonfinite` trigger fires at its backward
                  and the forward and backward are replayed eagerly under a trace (NOTE [Replayed loss
                  triggers]); no optimizer step (its gradients are NaN), only zero_grad

Ratios are per round (mode / plain), their median reported. Dynamo's compiles during the timed rounds are
counted: a gradscape mode that made the model compile again would show here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
for p in (str(BENCH_DIR), str(BENCH_DIR.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
from overhead import Runner  # noqa: E402
from workloads import _gpt  # noqa: E402

import gradscape  # noqa: E402

MODES = ("plain", "monitor", "traced", "eager_traced", "eager_plain", "compare", "replayed")


class CompiledRunner(Runner):
    """`Runner`'s modes on the compiled model, and the eager model's and compare_compiled's."""

    def __init__(self, backend: str) -> None:
        wl = _gpt("gpt6-small", n_layers=6, d_model=64, n_heads=4, batch=8, device="cpu", seq_len=32, vocab=256)
        self.eager_model = wl.model
        wl.model = torch.compile(wl.model, backend=backend)
        super().__init__(wl, "cpu")
        self.tre = gradscape.Tracer(self.eager_model, run="bench-eager", every=1)
        cfg = gradscape.Triggers(cap=10 ** 9, cooldown=0)
        self.trr = gradscape.Tracer(self.model, run="bench-replayed", every=10 ** 9, triggers=cfg)
        self.eager_i = self.compare_i = self.replayed_i = 0

    def close(self) -> None:
        super().close()
        self.tre.close()
        self.trr.close()

    def eager_plain(self) -> None:
        self.wl.loss(self.eager_model, self.batch).backward()
        self.opt.step()
        self.opt.zero_grad()

    def eager_traced(self) -> None:
        self.eager_i += 1
        with self.tre.step(self.eager_i):
            self.eager_plain()

    def compare(self) -> None:
        self.compare_i += 1

        def closure() -> torch.Tensor:
            loss = self.wl.loss(self.model, self.batch)
            loss.backward()
            return loss

        self.tr.compare_compiled(self.compare_i, closure)
        self.opt.step()
        self.opt.zero_grad()


    def replayed(self) -> None:
        self.replayed_i += 1
        with self.trr.step(self.replayed_i):
            (self.wl.loss(self.model, self.batch) * float("nan")).backward()
        self.opt.zero_grad()
        st = self.trr.last
        if st is None or st.step != self.replayed_i or st.meta.get("replay", {}).get("forward") != "replayed":
            raise RuntimeError(f"step {self.replayed_i} was not replayed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--modes", default=",".join(MODES), help="a comma-separated subset (plain always runs)")
    args = ap.parse_args()
    modes = tuple(dict.fromkeys(("plain", *args.modes.split(","))))
    if set(modes) - set(MODES):
        ap.error(f"unknown modes {sorted(set(modes) - set(MODES))}; choose from {MODES}")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    from torch._dynamo.utils import counters

    run = CompiledRunner(args.backend)
    for mode in modes:  # warm-up: the compile, and every mode once
        getattr(run, mode)()
    frames = counters["frames"]["total"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            times[mode].append(run.time(mode, reps=3))
    recompiles = counters["frames"]["total"] - frames
    run.close()
    plain = times["plain"]
    print(f"compiled GPT-6 (d=64, seq 32, batch 8), backend {args.backend}, {args.rounds} rounds, 1 thread")
    print(f"{'mode':14} {'median ms':>10} {'/ plain':>8}")
    for mode in modes:
        ratio = statistics.median(t / p for t, p in zip(times[mode], plain))
        print(f"{mode:14} {statistics.median(times[mode]) * 1e3:10.2f} {ratio:7.2f}x")
    if "traced" in times and "eager_traced" in times:
        traced_vs_eager = statistics.median(t / e for t, e in zip(times["traced"], times["eager_traced"]))
        print(f"traced compiled / traced eager: {traced_vs_eager:.2f}x")
    print(f"dynamo compiles while timed: {recompiles}")


if __name__ == "__main__":
    main()
