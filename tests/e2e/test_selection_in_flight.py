"""A click on a node selects it while another server callback is still in flight, in real headless Chromium.

Dash holds a requested callback back while a pending one could change its inputs; a loop in the page's
callback graph (the deep-link parser's output fed the selection, whose address fed the parser) made the
parser and everything after it wait on themselves, and Dash broke that loop only when nothing else was
pending. A click answered while another callback was in flight (here: the compare view opening, held
by the test at the network) then left the inspector on the old node until the next notification. Under
load that was tests/e2e/test_page_breakpoints.py waiting 45 s for the inspector; here it is made to
happen every time (tests/app/test_callback_graph.py checks the graph itself)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch
from playwright.sync_api import Page, Route

import gradscape
from gradscape.app.ui import ids


def _record(store: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    with gradscape.Tracer(model, run="r", sink=str(store)) as tr, tr.step(0):
        model(torch.randn(4, 6)).pow(2).sum().backward()


def _inspector_shows(node: int) -> str:
    return f"(document.querySelector('#{ids.INSPECTOR}') || {{innerText: ''}}).innerText.includes('(node n{node},')"



def test_a_click_on_a_node_selects_it_while_another_callback_is_in_flight(live_server: Any, page: Page) -> None:
    _record(live_server.store_path)
    with urllib.request.urlopen(f"{live_server.url}/api/runs/r/steps/0", timeout=10) as resp:
        graph = json.loads(resp.read())
    held: list[Route] = []

    def hold_compare(route: Route) -> None:
        body = json.loads(route.request.post_data or "{}")
        if f"{ids.COMPARE}.style" in str(body.get("output")):
            held.append(route)  # answered at the end of the test
        else:
            route.continue_()

    page.route("**/_dash-update-component*", hold_compare)
    page.goto(live_server.url)
    page.wait_for_function("window.cy && window.cy.nodes().length > 0 && window.gradscape.player.current")
    first = page.evaluate("window.gradscape.player.current.node")
    page.wait_for_function(_inspector_shows(first))  # the page opens on the player's node
    tapped = next(n["id"] for n in graph["nodes"] if n["name"] == "AddmmBackward0" and n["id"] != first)

    page.click(f"#{ids.COMPARE_OPEN}")  # a server callback that stays in flight
    deadline = time.monotonic() + 30
    while not held:
        assert time.monotonic() < deadline, "the compare view's callback was not sent"
        page.wait_for_timeout(20)  # lets Playwright deliver the route to the handler
    page.evaluate(f"void window.cy.getElementById('n{tapped}').emit('tap')")
    page.wait_for_function(_inspector_shows(tapped))
    page.wait_for_function(f"location.search.includes('node={tapped}')")
    assert page.locator(f"#{ids.COMPARE}").is_hidden()  # the held callback has not been answered yet
    assert len(held) == 1

    held.pop().continue_()
    page.wait_for_function(f"document.querySelector('#{ids.COMPARE}').style.display !== 'none'")
    assert page.evaluate(_inspector_shows(tapped))
    errors = [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]
    assert errors == []
