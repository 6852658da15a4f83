"""A step the Python recorder made, stored as maps (what earlier releases wrote) and as columns (this release:
its tables' columns, NOTE [Python steps as tables] in tracer/record/assemble.py), the same step both ways in
one run.

    python bench/stored_forms.py                    # LSTMCell loops of 40 and 700 time steps, 5 rounds
    python bench/stored_forms.py --lengths 2000 --rounds 3

Per loop length it prints the step's nodes, and for each form: `write` (`TraceStore.write_step`, the document
made, packed and committed), the file's bytes, `read` (`gradscape.load`'s `read_step`: the whole `StepTrace`)
and `index` (`read_indexed`: what the page reads first), the best of the rounds, with the columns' ratio to
the maps. Both are written by the same store; the maps through `step_to_graph`, as the store writes a step
the columns cannot hold.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gradscape  # noqa: E402
from gradscape.tracer import store as store_module  # noqa: E402
from gradscape.tracer.store import TraceStore  # noqa: E402


def _step(length: int) -> Any:
    """One step of an `nn.LSTMCell(4, 16)` and a head unrolled `length` times, by the Python recorder."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"cell": torch.nn.LSTMCell(4, 16), "head": torch.nn.Linear(16, 1)})
    x = torch.randn(length, 4, 4)
    with gradscape.Tracer(model, run="forms", recorder="python") as tr, tr.step(0) as st:
        h = c = x.new_zeros(4, 16)
        outs = []
        for t in range(length):
            h, c = model["cell"](x[t], (h, c))
            outs.append(model["head"](h))
        torch.stack(outs).pow(2).mean().backward()
    return st


def _best(f: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def _as_maps(st: Any) -> Any:
    return None


def measure(st: Any, form: str, folder: str, rounds: int) -> dict[str, float]:
    """Write `st` in `form` to a new file `rounds` times and read it back; the best times in ms, and bytes."""
    path = os.path.join(folder, f"{form}.sqlite")
    made = store_module.column_parts
    store_module.column_parts = made if form == "columns" else _as_maps  # type: ignore[assignment]
    try:
        def write() -> None:
            with TraceStore(path) as store:
                store.write_step(st)
        out = {"write": _best(write, rounds), "bytes": float(os.path.getsize(path))}
    finally:
        store_module.column_parts = made  # type: ignore[assignment]
    with TraceStore(path, readonly=True) as store:
        out["read"] = _best(lambda: store.read_step("forms", 0), rounds)
        out["index"] = _best(lambda: store.read_indexed("forms", 0), rounds)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="40,700", help="loop lengths, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}; best of {args.rounds}; columns / maps in brackets")
    print(f"{'nodes':>7} {'form':>8} {'write ms':>14} {'MB':>13} {'read ms':>14} {'index ms':>14}")
    for length in (int(x) for x in args.lengths.split(",")):
        st = _step(length)
        with tempfile.TemporaryDirectory() as folder:
            res = {form: measure(st, form, folder, args.rounds) for form in ("maps", "columns")}
        for form, r in res.items():
            cells = []
            for key in ("write", "bytes", "read", "index"):
                v = r[key] / 1e6 if key == "bytes" else r[key]
                ratio = f" ({r[key] / res['maps'][key]:.2f}x)" if form == "columns" else ""
                cells.append(f"{v:.2f}{ratio}")
            print(f"{len(st.nodes):>7} {form:>8} " + " ".join(f"{c:>14}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
