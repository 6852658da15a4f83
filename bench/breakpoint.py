"""Breakpoint benchmark: the time from a breakpoint hit in the training process to the page showing the
paused node, against the time from a step's end to the page showing that step, in the same run.

    python bench/breakpoint.py [--rounds 9]

A real server (werkzeug thread, this process), headless Chromium on its page, and a traced MLP trained on
a thread with a breakpoint (`{"on": "norm", "above": 0}`: the first node of every step). Each round: the
backward pauses (its hit noted by the tracer's wall clock), the page shows "paused in step i", the
benchmark clicks Continue on the page, the step completes and the page's step list shows it. The page
notes the wall time (`Date.now()`) the first time each text appears, from a MutationObserver installed
before its scripts, so Playwright's polling latency is not counted. Both paths are: tracer → server over
Socket.IO → `/ui` notification → the page reads the JSON API.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

import gradscape  # noqa: E402
from gradscape.app.server import ServerConfig, create_app  # noqa: E402
from gradscape.tracer.record.debug.breakpoints import Breaker, breaker  # noqa: E402
from gradscape.tracer.sinks.socket import SocketSink  # noqa: E402

logging.getLogger("werkzeug").setLevel(logging.CRITICAL)

OBSERVER = """
window.__seen = {};
new MutationObserver(function () {
  const now = Date.now();
  const where = document.getElementById('bp-where'), steps = document.getElementById('step-select');
  const banner = document.getElementById('bp-banner');
  const m = where && banner && banner.style.display !== 'none' && /paused in step (\\d+)/.exec(where.innerText);
  if (m && !(('bp' + m[1]) in window.__seen)) window.__seen['bp' + m[1]] = now;
  const s = steps && /step (\\d+)/.exec(steps.innerText);
  if (s && !(('st' + s[1]) in window.__seen)) window.__seen['st' + s[1]] = now;
}).observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
"""


def post(url: str, body: Any, method: str = "POST") -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    return ap.parse_args()


def start_server() -> tuple[Any, Any, str]:
    """The app on a werkzeug thread of this process: (app, http server, base url)."""
    tmp = tempfile.mkdtemp(prefix="gs-bench-bp-")
    app, sio = create_app(str(Path(tmp) / "bench.sqlite"), ServerConfig(notify_interval=0.05))
    http = make_server("127.0.0.1", 0, app.server, threaded=True)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    return app, http, f"http://127.0.0.1:{http.server_port}"


def note_hits(hits: dict[int, float]) -> None:
    """Wrap `Breaker._pause` so each hit's wall time (ms) is noted in `hits` by step."""
    original = Breaker._pause

    def timed_pause(self: Breaker, rec: Any, node: Any) -> None:
        hits[rec.step] = time.time() * 1e3
        original(self, rec, node)

    Breaker._pause = timed_pause  # type: ignore[method-assign]


def start_training(url: str, run: str, rounds: int,
                   ends: dict[int, float]) -> tuple[gradscape.Tracer, Breaker, threading.Event, threading.Thread]:
    """A traced MLP trained on a thread: step 0 at once, the rest once the returned event is set. Each
    step's end wall time (ms) is noted in `ends`. Returns (tracer, breaker, event, thread)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    x, y = torch.randn(64, 32), torch.randint(0, 10, (64,))
    tr = gradscape.Tracer(model, run=run, sink=SocketSink(url, run))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    b = breaker(run)
    while not (b.link is not None and b.link.connected):
        time.sleep(0.01)
    go = threading.Event()

    def train() -> None:
        for i in range(rounds + 1):
            if i == 1:
                go.wait()
            with tr.step(i):
                torch.nn.functional.cross_entropy(model(x), y).backward()
            ends[i] = time.time() * 1e3
            opt.step()
            opt.zero_grad()

    th = threading.Thread(target=train, daemon=True)
    th.start()
    return tr, b, go, th


def drive_page(url: str, run: str, b: Breaker, go: threading.Event, rounds: int,
               ends: dict[int, float]) -> dict[str, float]:
    """Open the page, set the breakpoint, release training and click Continue each round; returns the
    page's first-seen times (`window.__seen`)."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1500, "height": 950})
        page.add_init_script(OBSERVER)
        while 0 not in ends:
            time.sleep(0.01)
        page.goto(url)
        page.wait_for_function("window.cy && window.cy.nodes().length > 0")
        page.wait_for_function("(document.querySelector('#connection-status') || {innerText: ''})"
                               ".innerText.startsWith('live')")
        post(f"{url}/api/runs/{run}/breakpoints", {"on": "norm", "above": 0})
        while not b.armed:
            time.sleep(0.01)
        go.set()
        for i in range(1, rounds + 1):
            page.wait_for_function(f"'bp{i}' in window.__seen")
            page.click("#bp-continue")
            page.wait_for_function(f"'st{i}' in window.__seen")
        seen: dict[str, float] = page.evaluate("window.__seen")
        browser.close()
    return seen


def report(rounds: int, seen: dict[str, float], hits: dict[int, float], ends: dict[int, float]) -> None:
    pause_ms = [seen[f"bp{i}"] - hits[i] for i in range(1, rounds + 1)]
    step_ms = [seen[f"st{i}"] - ends[i] for i in range(1, rounds + 1)]
    med_p, med_s = statistics.median(pause_ms), statistics.median(step_ms)
    print(f"rounds: {rounds}")
    print(f"breakpoint hit -> page shows the paused node: median {med_p:.0f} ms "
          f"(min {min(pause_ms):.0f}, max {max(pause_ms):.0f})")
    print(f"step end -> page shows the step (baseline):   median {med_s:.0f} ms "
          f"(min {min(step_ms):.0f}, max {max(step_ms):.0f})")
    print(f"ratio (pause / step): {med_p / med_s:.2f}x")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    app, http, url = start_server()
    hits: dict[int, float] = {}
    ends: dict[int, float] = {}
    note_hits(hits)
    run = "bench-bp"
    tr, b, go, th = start_training(url, run, args.rounds, ends)
    seen = drive_page(url, run, b, go, args.rounds, ends)
    th.join(30)
    tr.close(10)
    report(args.rounds, seen, hits, ends)
    app.gradscape_state.notifier.stop()
    http.shutdown()


if __name__ == "__main__":
    main()
