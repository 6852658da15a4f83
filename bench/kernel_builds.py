"""The summary kernel's instruction-set builds side by side: µs per call for each build this CPU runs
(baseline, x86-64-v3 with AVX2, v4 with AVX-512), on gradients of the shapes a small transformer sends,
statistics alone and statistics with the thumbnail, and each build's time as a ratio to the baseline's.

    python bench/kernel_builds.py
    python bench/kernel_builds.py --calls 5000

The kernel is called through ctypes with its geometry made once (as the Python summariser calls it); the
native recorder calls the same functions from C++, without ctypes' ~1 µs a call. Rounds interleave the
builds, and each figure is the best round's mean, so that a noisy neighbour moves all builds alike.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR.parent) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR.parent))

import torch  # noqa: E402

from gradscape.tracer.summary import fastpath, kernel  # noqa: E402

SHAPES = [(4, 64, 64), (4, 64, 256), (4, 4, 64, 64), (1024, 256)]
THUMB = 64


def builds() -> dict[str, ctypes.CDLL]:
    """The builds there are and that this CPU runs, by name."""
    paths = kernel.builds()
    if not paths:
        raise SystemExit("the summary kernel is not built (pip install -e . builds it)")
    return {("baseline" if p.name.startswith("_fastsum.") else p.name.split(".")[0][len("_fastsum_"):]): kernel._load(p)
            for p in paths}


def time_call(fn: ctypes._CFuncPtr, x: torch.Tensor, geometry: list[int], words: int, calls: int) -> float:
    """µs a call, the mean of `calls` calls."""
    geom = (ctypes.c_int64 * 7)(*geometry)
    out = (ctypes.c_double * words)()
    args = (x.data_ptr(), ctypes.addressof(geom), ctypes.addressof(out))
    for _ in range(20):
        fn(*args)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t0) / calls * 1e6


def measure(libs: dict[str, ctypes.CDLL], shape: tuple[int, ...], calls: int,
            rounds: int) -> dict[tuple[str, str], float]:
    """The best round's µs a call, by (build, form)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    geometry, th = fastpath._native_geometry(shape, THUMB)
    cells = th[0] * th[1] if th else 0
    words = 8 + (cells + 1) // 2
    forms = {"stats": [x.numel(), 0, 0, 0, 0, 0, 0], "stats+thumb": [x.numel(), *geometry]}
    best: dict[tuple[str, str], float] = {}
    for _ in range(rounds):
        for name, lib in libs.items():
            for form, geom in forms.items():
                t = time_call(lib.gs_summarise_f32, x, geom, words, calls)
                best[(name, form)] = min(best.get((name, form), t), t)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report(args.calls, args.rounds)
    finally:
        torch.set_num_threads(threads)
    return 0


def report(calls: int, rounds: int) -> None:
    """A row per shape and form: each build's µs a call and its ratio to the baseline build's."""
    libs = builds()
    print(f"builds this CPU runs: {', '.join(libs)}; float32, thumbnail {THUMB}; µs a call (ratio to baseline)")
    print(f"{'shape':<18}{'form':<13}" + "".join(f"{name:>20}" for name in libs))
    for shape in SHAPES:
        best = measure(libs, shape, calls, rounds)
        for form in ("stats", "stats+thumb"):
            base = best[("baseline", form)]
            cells = "".join(f"{best[(n, form)]:>11.1f} ({best[(n, form)] / base:.2f}x)" for n in libs)
            print(f"{str(shape):<18}{form:<13}{cells}")


if __name__ == "__main__":
    sys.exit(main())
