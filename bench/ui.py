"""UI benchmark: navigation → interactive graph for a W4 step (12-layer GPT-like, ~530 autograd
nodes) and for a 10,000-node step (1,450 residual blocks in 50 stages), each against an empty Dash
page served the same way, in the same run, in headless Chromium; and FIRST expands: a click on each
folded module of the page's opening view (the 12 transformer blocks of W4, the 50 stages of the 10k
step), each opened for the first time on a fresh server, so nothing of it was laid out or cached
before, until the page has painted the module's box with its contents. Between two expands the module
is folded again (untimed), so every expand starts from the view the page opened with. The baseline,
in the same run: a few of the same clicks again, once the server has laid them out (what this
benchmark timed before: the server's cache, not a person's first click).

    python bench/ui.py [--rounds 9] [--workload W4] [--big-rounds 5] [--expands all] [--loop 10000,100000]

`--loop N[,M...]` adds an LSTMCell loop step of about N (and M...) autograd nodes (bench/pernode.py's),
opened on a fresh server every round (a person's first open: the step decoded and laid out), and a
first click on each of its folded modules: the loop's cell opens into its calls, the first 50 drawn
folded (app/view/call_folds.py), and a click on its first call and on its "more" node are timed too; a
module too big to draw (over `view.MAX_DRAWN` nodes) answers by staying folded with a line that says so.
`scan10000` in `--loop` is a scan of about 10,000 ops written out in one module called once
(`workloads.scan_loop`): it opens into runs of its ops (app/view/op_runs.py), and a click on its first run is
timed too. `--loop-only` times only that (python bench/ui.py --loop 10000,100000,scan10000,scan100000
--loop-only).

Every trace also gets a first click to heatmaps: on a fresh server, the page opened and settled, one
click on a node other than the one shown, until the inspector has drawn that node's first heatmap (the
page's clock, from the mouse press).

"Interactive" is timed by the page's own clock: a script installed before any of the page's own
(Playwright's `add_init_script`) checks the readiness condition on every DOM change and animation
frame and notes `performance.now()` (milliseconds since navigation start) the first time it holds.
Timing from the Python side instead adds Playwright's own latency, which is not the page's: its
`wait_for_function` poll is injected only once the page's scripts let it run, and that measured
100–300 ms late in about half the rounds, more often on the heavier page. Both figures are printed;
the ratio uses the page clock.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import dash  # noqa: E402
import torch  # noqa: E402
from dash import html  # noqa: E402
from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402
from ui_calls import call_clicks, click_element, run_clicks, settle  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402
from workloads import build, lstm_loop, residual_stages, scan_loop  # noqa: E402

import gradscape  # noqa: E402
from gradscape.app.server import ServerConfig, create_app  # noqa: E402

# Notes when the page became interactive, by its own clock (see the module docstring). The condition is
# the same one the Python side waits for: for gradscape, a drawn graph and the player's "k of n" line.
READY_PROBE = """
(() => {
  window.__gsReadyMs = null;
  const ready = () => {
    if (document.getElementById('ready')) return true;
    const player = document.querySelector('#backward-player');
    return !!(window.cy && window.cy.nodes().length > 0 && player && player.innerText.includes(' of '));
  };
  const check = () => {
    if (window.__gsReadyMs !== null) return true;
    if (ready()) { window.__gsReadyMs = performance.now(); return true; }
    return false;
  };
  new MutationObserver((_, obs) => { if (check()) obs.disconnect(); })
    .observe(document, {subtree: true, childList: true, characterData: true});
  const frame = () => { if (!check()) requestAnimationFrame(frame); };
  requestAnimationFrame(frame);
})();
"""

NO_ANSWER_MS = 60_000  # a first expand not drawn by then is reported as not answered ("a click that does nothing")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def serve(wsgi: object) -> tuple[str, object]:
    srv = make_server("127.0.0.1", 0, wsgi, threaded=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_port}", srv


def serve_process(store: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """`gradscape serve` on `store` in a new process, as a person starts it; its URL once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "gradscape", "serve", "--store", str(store), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # listening: no request before the page's own (Dash's first
        try:                               # request of any kind builds the page, and with it the step)
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return url, proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise TimeoutError(f"gradscape serve did not answer at {url}")


def record_loop(store: Path, spec: str) -> int:
    """One step of bench/pernode.py's LSTMCell loop of about `spec` autograd nodes (`scan10000`: a scan of
    about 10,000 ops in one module, `workloads.scan_loop`)."""
    wl = scan_loop(int(spec[4:])) if spec.startswith("scan") else lstm_loop(int(spec))
    with gradscape.Tracer(wl.model, run="bench", sink=str(store), tensors="summary") as tr, tr.step(0) as st:
        wl.loss(wl.model, wl.batch()).backward()
    return len(st.nodes) if st else 0


def record_big(store: Path) -> int:
    """One step of `residual_stages` (about 10,150 autograd nodes)."""
    model = residual_stages()
    with gradscape.Tracer(model, run="bench", sink=str(store), tensors="summary") as tr, tr.step(0) as st:
        model(torch.randn(2, 4)).sum().backward()
    return len(st.nodes) if st else 0


EXPAND_PROBE = """
(box) => {
  // the page's own clock: from the mouse press on the module to the first frame after its box is drawn
  // with its contents (the condition checked on every animation frame)
  window.__gsExpand = {t0: null, t1: null};
  document.addEventListener('mousedown', () => { window.__gsExpand.t0 = performance.now(); },
                            {capture: true, once: true});
  const frame = () => {
    const b = window.cy && window.cy.getElementById(box);
    // or the page's answer that the module is too big to draw (it stays folded, the info line says so)
    const info = document.querySelector('#graph-info');
    if ((b && b.length && b.children().length) || (info && info.innerText.includes(box.slice(2) + ' stays folded'))) {
      requestAnimationFrame(() => { window.__gsExpand.t1 = performance.now(); });
      return;
    }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="W4")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--big-rounds", type=int, default=5, help="rounds for the 10,000-node step (0: skip it)")
    ap.add_argument("--loop", default="", help="also LSTMCell loop steps of about these many nodes, comma "
                    "separated (10000,100000: the scale goal), each opened on a fresh server each round")
    ap.add_argument("--expands", default="all", help="how many folded modules to expand (first expands): "
                    "'all' or a number, spread evenly over the page's folded modules")
    ap.add_argument("--loop-only", action="store_true", help="only the --loop steps' first expands and their "
                    "calls' clicks (no W4, no 10k step, no open or heatmap timings)")
    args = ap.parse_args()
    if args.loop_only:
        for size in [n.strip() for n in args.loop.split(",") if n.strip()]:
            loop = Path(tempfile.mkdtemp(prefix="gradscape-ui-")) / "loop.sqlite"
            print(f"{'scan' if size.startswith('scan') else 'LSTMCell'} loop: {record_loop(loop, size)} autograd nodes")
            first_expands(loop, "all")
        return
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    empty = dash.Dash("empty")
    empty.layout = html.Div("empty page", id="ready")
    empty_url, _ = serve(empty.server)
    store = Path(tempfile.mkdtemp(prefix="gradscape-ui-")) / "ui.sqlite"
    wl = build(args.workload)
    batch = wl.batch()
    with gradscape.Tracer(wl.model, run="bench", sink=str(store)) as tr, tr.step(0) as st:
        wl.loss(wl.model, batch).backward()
    nodes = len(st.nodes) if st else 0
    print(f"gradscape UI benchmark: torch {torch.__version__}, loadavg {os.getloadavg()}")
    print(f"{args.workload} {wl.name}, {nodes} autograd nodes")
    measure_open(store, empty_url, args.rounds)
    first_heatmaps(store)
    first_expands(store, args.expands)
    if args.big_rounds > 0:
        big = Path(tempfile.mkdtemp(prefix="gradscape-ui-")) / "big.sqlite"
        print(f"10k: 1,450 residual blocks in 50 stages, {record_big(big)} autograd nodes")
        measure_open(big, empty_url, args.big_rounds)
        first_heatmaps(big)
        first_expands(big, args.expands)
    for size in [n.strip() for n in args.loop.split(",") if n.strip()]:
        loop = Path(tempfile.mkdtemp(prefix="gradscape-ui-")) / "loop.sqlite"
        print(f"{'scan' if size.startswith('scan') else 'LSTMCell'} loop: {record_loop(loop, size)} autograd nodes")
        measure_open(loop, empty_url, max(args.big_rounds, 3), fresh=True)
        first_heatmaps(loop)
        first_expands(loop, "all")


def measure_open(store: Path, empty_url: str, rounds: int, fresh: bool = False) -> None:
    """Navigation → interactive graph, against the empty page, alternating which goes first. `fresh`: a
    new `gradscape serve` process for every round, so each open decodes and lays out the step as a
    person's first does (otherwise the untimed first round fills the server's cache)."""
    app, _sio = create_app(str(store), ServerConfig())
    url, _ = serve(app.server)
    t_page, t_empty, ratios = [], [], []
    wall_page, wall_empty = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
        for r in range(rounds + 1):
            times = {}
            for name in (["empty", "page"] if r % 2 else ["page", "empty"]):
                ctx = browser.new_context(viewport={"width": 1500, "height": 950})
                ctx.add_init_script(READY_PROBE)
                pg = ctx.new_page()
                pg.set_default_timeout(120_000)
                if fresh and name == "page":
                    url, proc = serve_process(store)
                t0 = time.perf_counter()
                pg.goto(empty_url if name == "empty" else url)
                wait_ready(pg, name)
                times[name + " wall"] = time.perf_counter() - t0
                pg.wait_for_function("window.__gsReadyMs !== null")
                times[name] = pg.evaluate("window.__gsReadyMs") / 1e3
                ctx.close()
                if fresh and name == "page":
                    proc.terminate()
                    proc.wait(30)
            if r == 0:
                continue  # warm-up: first Chromium start, caches
            t_page.append(times["page"])
            t_empty.append(times["empty"])
            wall_page.append(times["page wall"])
            wall_empty.append(times["empty wall"])
            ratios.append(times["page"] / times["empty"])
            print(f"  round {r}: page {times['page']:.2f} s, empty {times['empty']:.2f} s (page clock); "
                  f"{times['page wall']:.2f} s / {times['empty wall']:.2f} s as Playwright saw them")
        browser.close()
    med = statistics.median
    print(f"navigation → interactive graph: {med(t_page):.2f} s (empty Dash page {med(t_empty):.2f} s), "
          f"ratio {med(ratios):.2f}x over {rounds} rounds (page clock)")
    print(f"  as Playwright saw them: {med(wall_page):.2f} s vs {med(wall_empty):.2f} s, "
          f"ratio of medians {med(wall_page) / med(wall_empty):.2f}x")


def wait_ready(pg: Any, name: str) -> None:
    if name == "empty":
        pg.wait_for_selector("#ready")
    else:
        pg.wait_for_function("window.cy && window.cy.nodes().length > 0 && "
                             "document.querySelector('#backward-player').innerText.includes(' of ')")


def open_page(browser: Any, url: str) -> Any:
    """A new page on `url`, open and interactive (its resource timings kept: `settle` counts them)."""
    pg = browser.new_page(viewport={"width": 1500, "height": 950})
    pg.set_default_timeout(120_000)
    pg.goto(url)
    pg.evaluate("performance.setResourceTimingBufferSize(1000000)")  # settle() counts requests
    wait_ready(pg, "page")
    return pg


def first_expands(store: Path, which: str) -> list[float]:
    """Click each folded module of the opening view once, on a server that has never laid it out
    (a fresh `gradscape serve` per trace, as a person starts it); fold it back (untimed) between clicks.
    Prints p50/p95/max."""
    url, proc = serve_process(store)
    out: list[float] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
        pg = open_page(browser, url)
        pg.wait_for_function("window.gradscape.graph && window.gradscape.graph.opened")
        folded = pg.evaluate("window.cy.nodes().filter(n => n.id().startsWith('m:')).map(n => n.id())")
        opening = pg.evaluate("window.cy.nodes().length")
        chosen = folded if which == "all" else folded[::max(1, len(folded) // max(1, int(which)))]
        settle(pg)  # a person's first click comes after the page has finished opening
        stuck: list[str] = []  # clicks the page did not answer within NO_ANSWER_MS (it is left as it is then)
        for module in chosen:
            try:
                out.append(expand_once(pg, module))
            except PlaywrightTimeout:
                stuck.append(module)
                print(f"  first expand of {module}: no answer within {NO_ANSWER_MS / 1e3:.0f} s")
                break
            print(f"  first expand of {module}: {out[-1]:.3f} s")
            if pg.evaluate(f"window.cy.getElementById('c:{module[2:]}#more').length === 1"):
                call_clicks(pg, module[2:], settle, NO_ANSWER_MS)
            if pg.evaluate(f"window.cy.getElementById('o:{module[2:]}#0.1').length === 1"):
                run_clicks(pg, module[2:], settle, NO_ANSWER_MS)
            fold_back(pg, module, opening)
        again = []  # the baseline, in the same run: the same clicks once the server has laid them out
        for module in ([] if stuck else chosen[::max(1, len(chosen) // 10)]):
            again.append(expand_once(pg, module))
            fold_back(pg, module, opening)
        browser.close()
    proc.terminate()
    proc.wait(30)
    if stuck or not out:
        print(f"first expand: {len(out)} answered, {stuck} not answered within {NO_ANSWER_MS / 1e3:.0f} s")
        return out
    q = statistics.quantiles(out, n=20, method="inclusive") if len(out) > 1 else out * 19
    print(f"first expand, {len(out)} modules: p50 {statistics.median(out):.2f} s, p95 {q[18]:.2f} s, "
          f"max {max(out):.2f} s (page clock, click → module drawn); the same click once laid out: median "
          f"{statistics.median(again):.2f} s over {len(again)}, ratio of medians "
          f"{statistics.median(out) / statistics.median(again):.2f}x")
    return out


HEATMAP_PROBE = """
(node) => {
  // the page's own clock: from the mouse press on the node to the first frame after the inspector shows
  // that node with a heatmap drawn
  window.__gsHeat = {t0: null, t1: null};
  document.addEventListener('mousedown', () => { window.__gsHeat.t0 = performance.now(); },
                            {capture: true, once: true});
  const frame = () => {
    const ins = document.getElementById('inspector');
    if (ins && ins.innerText.includes('(node ' + node + ',') && ins.querySelector('.gs-slot .main-svg')) {
      requestAnimationFrame(() => { window.__gsHeat.t1 = performance.now(); });
      return;
    }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}
"""


def first_heatmaps(store: Path) -> float:
    """A person's first click on a node (not the one the page opened on) on a fresh server, until the
    inspector has drawn its heatmaps (page clock). Prints and returns the seconds."""
    url, proc = serve_process(store)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
        pg = open_page(browser, url)
        pg.wait_for_function("(document.getElementById('inspector')?.innerText || '').includes('(node n')")
        settle(pg)
        node = pg.evaluate("""() => { const shown = document.getElementById('inspector').innerText;
          const ops = window.cy.nodes().filter(n => /^n[0-9]+$/.test(n.id())
            && !shown.includes('(node ' + n.id() + ','));
          return ops.length ? ops[0].id() : null; }""")
        if node is None:
            browser.close()
            proc.terminate()
            proc.wait(30)
            print("first click to heatmaps: no other node drawn")
            return float("nan")
        pg.evaluate(HEATMAP_PROBE, node)
        at = pg.evaluate("""(id) => { const n = window.cy.getElementById(id); window.cy.center(n);
          const r = n.renderedPosition(), box = window.cy.container().getBoundingClientRect();
          return {x: box.left + r.x, y: box.top + r.y}; }""", node)
        pg.mouse.click(at["x"], at["y"])
        pg.wait_for_function("window.__gsHeat.t1 !== null && window.__gsHeat.t0 !== null")
        t = pg.evaluate("window.__gsHeat")
        browser.close()
    proc.terminate()
    proc.wait(30)
    took = float(t["t1"] - t["t0"]) / 1e3
    print(f"first click to heatmaps ({node}): {took:.2f} s (page clock, click → heatmap drawn)")
    return took


def expand_once(pg: Any, module: str) -> float:
    """One person's click on `module` (brought into view first); seconds until its box is drawn."""
    box = "g:" + module[2:]
    pg.evaluate(EXPAND_PROBE, box)
    click_element(pg, module)
    pg.wait_for_function("window.__gsExpand.t1 !== null && window.__gsExpand.t0 !== null", timeout=NO_ANSWER_MS)
    t = pg.evaluate("window.__gsExpand")
    return float(t["t1"] - t["t0"]) / 1e3


def fold_back(pg: Any, module: str, opening: int) -> None:
    """Fold `module` again through the page's own store (untimed), and wait for the opening view."""
    pg.evaluate("""(m) => { const d = window.dash_clientside, cy = window.cy;
      const folded = cy.nodes().filter(n => n.id().startsWith('m:')).map(n => n.id().slice(2));
      d.set_props('collapsed-modules', {data: {run: 'bench', collapsed: folded.concat([m]).sort()}}); }""",
                module[2:])
    pg.wait_for_function(f"window.cy.getElementById('{module}').length === 1 && "
                         f"window.cy.nodes().length === {opening}")
    settle(pg)


if __name__ == "__main__":
    main()
