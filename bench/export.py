"""Size and time of the offline HTML file of one step (`gradscape export`, `st.to_html`), per workload,
in summary mode, against the same step in a SQLite trace file written in the same run.

    python bench/export.py [W1 W2 W3 W4 lstm10000]   default: W1-W4; the goals: W4 (gpt12) and a 10k-node
                                                     LSTMCell loop (lstm10000) ≤ 5 MB, the loop's in ≤ 5 s

Prints, per workload: nodes, tensors, the file's size and its parts (page data JSON, heatmap cells,
scripts and styles), the views laid out (one per fold that opens, within NOTE [Export budgets] in
app/export/views.py), the time to write it from the step in memory (`st.to_html`) and from the trace
file (`gradscape export`, which reads the stored step's node maps, made from its columns, and arrays, no
`StepTrace`), and the ratio to the step's trace file.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import gradscape  # noqa: E402
from bench.workloads import build, lstm_loop  # noqa: E402
from gradscape.app.export.html import export_file, write_html  # noqa: E402

BUDGET = 5 * 1024 * 1024
MB = 1024 * 1024


def measure(key: str, folder: Path) -> None:
    w = lstm_loop(int(key[4:])) if key.startswith("lstm") else build(key)
    db = folder / f"{key}.sqlite"
    with gradscape.Tracer(w.model, sink=str(db), run=key) as tr, tr.step(0) as st:
        w.loss(w.model, w.batch()).backward()
    assert st is not None
    t0 = time.perf_counter()
    path = write_html(st, folder / f"{key}.html")
    took = time.perf_counter() - t0
    t0 = time.perf_counter()
    export_file(db, key, 0, 0, folder / f"{key}-export.html")
    from_file = time.perf_counter() - t0
    text = path.read_text(encoding="utf-8")
    size = path.stat().st_size
    part = {name: len(m.group(1).encode()) for name, m in (
        ("data", re.search(r'id="gs-data">(.*?)</script>', text, re.S)),
        ("cells", re.search(r'id="gs-cells">(.*?)</script>', text, re.S))) if m}
    packed = re.search(r'id="gs-data">(.*?)</script>', text, re.S)  # deflated, base64 (app/export/html.py)
    states = len(json.loads(zlib.decompress(base64.b64decode(packed.group(1))))["states"]) if packed else 0
    print(f"{key} {w.name}: {len(st.nodes)} nodes, {len(st.modules)} modules, {states} views laid out; "
          f"file {size / MB:.2f} MB (data {part.get('data', 0) / MB:.2f}, cells {part.get('cells', 0) / MB:.2f}, "
          f"page code {(size - sum(part.values())) / MB:.3f}) in {took:.1f} s ({from_file:.1f} s from the file); "
          f"trace file {db.stat().st_size / MB:.2f} MB (ratio {size / db.stat().st_size:.2f}); "
          f"{'within' if size <= BUDGET else 'OVER'} the 5 MB budget ({size / BUDGET:.0%})", flush=True)


def main() -> None:
    keys = sys.argv[1:] or ["W1", "W2", "W3", "W4"]
    with tempfile.TemporaryDirectory() as tmp:
        for key in keys:
            measure(key, Path(tmp))


if __name__ == "__main__":
    main()
