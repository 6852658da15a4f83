"""What the page's server spends on the find box of a big step: an `nn.LSTMCell` loop's step traced into a trace
file, then read as a fresh page reads it (`PageData`): the step opened (`graph`, its index and lazy maps), the
find box's first options, a first query typed (which makes every node's label), a second, and `find` of an op
name. Times are the server's own, one step; run it on a quiet machine.

    python bench/find_box.py [--loop 100000]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import lstm_loop  # noqa: E402

import gradscape  # noqa: E402
from gradscape.app import view  # noqa: E402
from gradscape.app.data import PageData  # noqa: E402
from gradscape.tracer.store import TraceStore  # noqa: E402


def _ms(t0: float) -> str:
    return f"{(time.perf_counter() - t0) * 1e3:.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loop", type=int, default=100_000, help="nodes of the LSTMCell loop's step")
    args = ap.parse_args()
    wl = lstm_loop(args.loop)
    path = Path(tempfile.mkdtemp()) / "find.sqlite"
    with gradscape.Tracer(wl.model, run="find", sink=str(path)) as tr, tr.step(0):
        wl.loss(wl.model, wl.batch()).backward()
    del tr
    gc.collect()
    with TraceStore(path) as store:
        data = PageData(store)
        t0 = time.perf_counter()
        wire = data.graph("find", 0)
        print(f"{len(wire['nodes']):,} nodes: the step opened {_ms(t0)}")
        t0 = time.perf_counter()
        first = data.search_index("find", 0)
        print(f"  the find box's first options ({len(first)}): {_ms(t0)}")
        table = data.search_table("find", 0)
        for q in ("sigmoid", "tanh"):
            t0 = time.perf_counter()
            hits = table.search(q, limit=view.SEARCH_HITS)
            print(f"  {q!r} typed ({len(hits)} hits): {_ms(t0)}")
        t0 = time.perf_counter()
        found = table.find("SigmoidBackward0")
        print(f"  find 'SigmoidBackward0' -> {found}: {_ms(t0)}")


if __name__ == "__main__":
    main()
