"""What the page's server spends on the find box of a big step: an `nn.LSTMCell` loop's step traced into a trace
file, then read as a fresh page reads it (`PageData`): the step opened (`graph`, its index and lazy maps), the
find box's first options, a first query typed (which makes every node's label), a second, and `find` of an op
name. Times are the server's own, one step; run it on a quiet machine.

`--browser`: as a person uses it, in headless Chromium on a fresh `gradscape serve` of that file: the page
opened, the find box clicked, a node's id typed (`n50001)`, found by no first option: the server searches),
timed by the page's own clock from the first key to the first frame that shows the node's option.

    python bench/find_box.py [--loop 100000] [--browser]
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


# the find box's search field has the caret (Dash 4's dropdown opens a popover, which takes it a moment later)
CARET = """() => { const a = document.activeElement;
  return !!(a && a.matches('input.dash-dropdown-search')); }"""
# notes the page's clock at the first key, and at the first frame in which `text` is on the page
SHOWN_PROBE = """(text) => {
  window.__gsFind = {t0: null, t1: null};
  document.addEventListener('keydown', () => { if (window.__gsFind.t0 === null) window.__gsFind.t0 =
    performance.now(); }, {capture: true});
  const frame = () => {
    if (document.body.innerText.includes(text)) { window.__gsFind.t1 = performance.now(); return; }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}"""


def in_browser(path: Path, node: int) -> None:
    """The page opened on a fresh server; the find box clicked; `n<node>)` typed; until its option shows."""
    from playwright.sync_api import sync_playwright
    from ui import ARGS, serve_process, wait_ready

    url, proc = serve_process(path)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
            pg = browser.new_page(viewport={"width": 1500, "height": 950})
            pg.set_default_timeout(120_000)
            t0 = time.perf_counter()
            pg.goto(url)
            wait_ready(pg, "page")
            print(f"  the page opened: {_ms(t0)} (Playwright's clock)")
            pg.click("#search")
            pg.wait_for_function(CARET)
            text = f"(n{node})"
            pg.evaluate(SHOWN_PROBE, text)
            pg.keyboard.type(f"n{node})")
            pg.wait_for_function("window.__gsFind.t1 !== null")
            t = pg.evaluate("window.__gsFind")
            print(f"  {text} typed in the find box: its option shown {t['t1'] - t['t0']:.0f} ms after the first key "
                  "(the page's clock)")
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loop", type=int, default=100_000, help="nodes of the LSTMCell loop's step")
    ap.add_argument("--browser", action="store_true", help="the find box typed in, in headless Chromium")
    args = ap.parse_args()
    wl = lstm_loop(args.loop)
    path = Path(tempfile.mkdtemp()) / "find.sqlite"
    with gradscape.Tracer(wl.model, run="find", sink=str(path)) as tr, tr.step(0):
        wl.loss(wl.model, wl.batch()).backward()
    del tr
    gc.collect()
    if args.browser:
        in_browser(path, args.loop // 2 + 1)
        return
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
