"""Breakpoints from the page, in real headless Chromium: a real server (in this process), a real
training subprocess (tests/bp_worker.py); a person selects a node, sets a break on it, sees the
paused backward, steps one node and continues."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from playwright.sync_api import Page

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bp_harness import call, paused, reference_params, wait_for  # noqa: E402


class _Srv:
    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str) -> Any:
        return call(self, "GET", path)[1]


def _text(sel: str) -> str:
    return f"(document.querySelector('{sel}') || {{innerText: ''}}).innerText"


def test_break_step_continue_from_the_page(live_server: Any, page: Page, worker_factory: Any) -> None:
    srv = _Srv(live_server.url)
    w = worker_factory("--url", srv.url, "--run", "web", "--steps", "3", "--gate", "1")
    w.expect("ready")
    w.go()
    w.expect("gate")  # step 0 is traced; the loop waits before step 1
    wait_for(lambda: call(srv, "GET", "/api/runs/web/steps")[0] == 200, what="step 0 stored")
    graph = srv.api("/api/runs/web/steps/0")
    fc2 = next(n for n in graph["nodes"] if n["name"] == "AddmmBackward0" and n["module"] == "fc2")

    page.goto(srv.url)
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_function(_text("#connection-status") + ".startsWith('live')")
    assert page.locator("#bp-step").is_hidden() and page.locator("#bp-continue").is_hidden()
    # select fc2's addmm on the graph and break on it (by name: the default kind)
    page.evaluate(f"void window.cy.getElementById('n{fc2['id']}').emit('tap')")
    page.wait_for_function(_text("#inspector") + f".includes('(node n{fc2['id']},')")
    page.click("#bp-set")
    page.wait_for_function(_text("#bp-list") + ".includes('node AddmmBackward0')")
    assert srv.api("/api/runs/web/breakpoints")["breakpoints"] == [{"on": "node", "name": "AddmmBackward0"}]

    w.go()  # step 1 starts, and pauses at fc2's addmm
    page.wait_for_function(_text("#bp-where") + ".includes('paused in step 1 at AddmmBackward0')")
    p = paused(srv, "web")
    assert p["node"]["id"] == fc2["id"] and p["node"]["module"] == "fc2"
    k = p["executed"]
    assert f"{k} nodes run" in page.inner_text("#bp-where")
    # the partial backward: one row per node run, the paused one on top; those nodes lit on the graph
    assert page.locator("#bp-nodes tr").count() == k
    assert page.locator("#bp-nodes tr.gs-bp-current").get_attribute("data-node") == str(fc2["id"])
    assert "‖·‖" in page.inner_text("#bp-nodes tr.gs-bp-current")
    current = page.evaluate(f"window.cy.getElementById('n{fc2['id']}').style('border-color')")
    assert current == "rgb(208,0,0)"

    # another site's page (here: the other loopback name, a different origin) cannot resume or clear it
    other = page.context.new_page()
    other.goto(srv.url.replace("127.0.0.1", "localhost") + "/api/runs")
    for path, body in [("/resume", '{"mode": "continue"}'), ("/breakpoints", '{"on": "nonfinite"}')]:
        # a "simple" request: sent without a preflight, with the other page's Origin
        other.evaluate("([u, b]) => fetch(u, {method: 'POST', body: b, mode: 'no-cors', "
                       "headers: {'Content-Type': 'text/plain'}}).then(r => r.type)", [srv.url + "/api/runs/web" + path,
                                                                                     body])
    other.close()
    assert paused(srv, "web", k)
    assert srv.api("/api/runs/web/breakpoints")["breakpoints"] == [{"on": "node", "name": "AddmmBackward0"}]

    # a page opened while the run is paused shows it too (the server's catch-up names the run)
    fresh = page.context.new_page()
    fresh.goto(srv.url)
    fresh.wait_for_function(_text("#bp-where") + f".includes('paused in step 1 at AddmmBackward0 #{fc2['id']}')")
    assert fresh.locator("#bp-continue").is_visible()
    fresh.close()

    page.click("#bp-step")  # one more node
    page.wait_for_function(_text("#bp-where") + f".includes('{k + 1} nodes run')")
    assert paused(srv, "web", k + 1)
    assert page.locator("#bp-nodes tr").count() == k + 1
    assert w.lines.empty()  # the loop did not get past the paused backward

    page.click("#bp-clear")
    page.wait_for_function(_text("#bp-list") + ".includes('no breakpoints')")
    page.click("#bp-continue")
    page.wait_for_function("document.querySelector('#bp-banner').style.display === 'none'")
    w.expect("step 1")
    out, _ = w.result()
    assert out["pauses"] == 2
    assert out["params"] == reference_params()
    errors = [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]
    assert errors == []
