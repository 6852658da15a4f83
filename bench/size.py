"""Trace size a node, and what a gradient's summary costs in each floating dtype.

Part 1: one traced step of an nn.LSTMCell(32, 32), batch 8, unrolled T times (about 15 autograd nodes
a time step; T=1666 → ~25k nodes, T=6666 → ~100k), written to a fresh trace file with the default
options (summary mode, the default thumbnail budget). Printed: nodes, the file's bytes and bytes a
node, the plain step (forward + backward, untraced) and the traced step (forward + backward + the
write) in seconds, and the read back (`gradscape.load`) with its ratio to the plain step.
`--final-loss` puts the loss on the last output only, as in the issue's measurement: gradients then
vanish a few hundred steps back, and most thumbnails are zeros.

Part 2: `Summariser.summarise` and `finalize` over the gradients of one LSTMCell time step (15 of
[8, 32], 3 of [8, 128], 2 of [128], 2 of [128, 32]), in float16, bfloat16, float32 and float64, as µs a
tensor and the ratio to float32 (each the median of `--rounds`).

    python bench/size.py [--steps 1666,6666] [--final-loss] [--rounds 21] [--no-size] [--no-dtypes]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import gradscape  # noqa: E402
from gradscape.tracer.summary.summariser import Summariser  # noqa: E402

STEP_SHAPES = [(8, 32)] * 15 + [(8, 128)] * 3 + [(128,)] * 2 + [(128, 32)] * 2
GPT_SHAPES = [(8, 64, 128)] * 4 + [(8, 64, 512)] * 2  # a block of the nanoGPT of bench/overhead.py's W9/W10


def _lstm(steps: int, final_loss: bool) -> tuple[torch.nn.Module, torch.Tensor, object]:
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(32, 32)
    x = torch.randn(steps, 8, 32)

    def loss() -> torch.Tensor:
        h = c = torch.zeros(8, 32)
        outs = []
        for t in range(steps):
            h, c = cell(x[t], (h, c))
            outs.append(h)
        return h.pow(2).mean() if final_loss else torch.stack(outs).pow(2).mean()

    return cell, x, loss


def size_row(steps: int, final_loss: bool) -> None:
    cell, _, loss = _lstm(steps, final_loss)
    t0 = time.perf_counter()
    loss().backward()  # type: ignore[operator]
    plain = time.perf_counter() - t0
    cell.zero_grad()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "size.sqlite"
        t0 = time.perf_counter()
        with gradscape.Tracer(cell, sink=str(path), run="size") as tr, tr.step(0) as st:
            loss().backward()  # type: ignore[operator]
        traced = time.perf_counter() - t0
        assert st is not None
        t0 = time.perf_counter()
        back = gradscape.load(path)
        read = time.perf_counter() - t0
        size = os.path.getsize(path)
    n = len(back.nodes)
    left = st.meta.get("thumbs_left_out", {}).get("count", 0)
    print(f"T={steps:5d}  nodes={n:7d}  file={size / 1e6:7.1f} MB  {size / n:5.0f} B/node  "
          f"thumbnails left out={left:6d}  plain={plain:6.2f}s  traced+write={traced:6.2f}s  "
          f"read back={read:6.2f}s ({read / plain:.2f}x plain)", flush=True)


def _time(s: Summariser, xs: list[torch.Tensor], repeat: int) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        for x in xs:
            s.summarise(x)
        s.finalize()
    return (time.perf_counter() - t0) / (repeat * len(xs)) * 1e6


def dtype_table(rounds: int, scale: float, shapes: list[tuple[int, ...]], label: str) -> None:
    """Rounds interleave the dtypes (the one timed first rotates), and each ratio is the median of
    the per-round ratios, which holds up on a shared machine better than a ratio of medians. `scale`
    multiplies the values: gradients are small, and at 1e-6 most float16 values are subnormal (the
    kernel once ran ten times slower on those)."""
    torch.manual_seed(0)
    base = [torch.randn(s) * scale for s in shapes]
    dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    cases = {dt: ([x.to(dt) for x in base], Summariser(thumb=64)) for dt in dtypes}
    for xs, s in cases.values():
        _time(s, xs, 1)  # the first call of each shape makes its plan
    times: dict[torch.dtype, list[float]] = {dt: [] for dt in dtypes}
    for r in range(rounds):
        for dt in dtypes[r % 4:] + dtypes[:r % 4]:
            times[dt].append(_time(cases[dt][1], cases[dt][0], 10))
    print(f"{label}, values ~ N(0, {scale:g}²)")
    print(f"{'dtype':10s} {'µs/tensor':>10s} {'vs float32':>10s}")
    for dt in dtypes:
        ratio = statistics.median(a / b for a, b in zip(times[dt], times[torch.float32]))
        print(f"{str(dt).replace('torch.', ''):10s} {statistics.median(times[dt]):10.1f} {ratio:10.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="1666,6666", help="time steps to unroll, comma-separated")
    ap.add_argument("--final-loss", action="store_true", help="the loss on the last output only")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--no-size", action="store_true")
    ap.add_argument("--no-dtypes", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, summariser {gradscape.tracer.summary.kernel.summariser()}, 1 thread")
    if not args.no_size:
        for steps in (int(s) for s in args.steps.split(",")):
            size_row(steps, args.final_loss)
    if not args.no_dtypes:
        for shapes, label in ((STEP_SHAPES, "LSTMCell time step"), (GPT_SHAPES, "nanoGPT block")):
            for scale in (1.0, 1e-6):
                dtype_table(args.rounds, scale, shapes, label)


if __name__ == "__main__":
    main()
