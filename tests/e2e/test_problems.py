"""The problems panel (#problems) in real headless Chromium against a real server: the count and the
lines of the step shown, a click that selects the problem's node, and a streamed step's problems."""

from __future__ import annotations

import time
from typing import Any

import torch
from playwright.sync_api import Page
from problem_cases import line_of, log_of_negative, sqrt_of_sqrt

import gradscape
from gradscape.tracer.store import TraceStore

PANEL = "(document.querySelector('#problems') || {innerText: ''}).innerText"


def _open(page: Page, url: str) -> None:
    page.goto(url)
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")


def _finite_step(tr: gradscape.Tracer, i: int) -> None:
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with tr.step(i):
        (x * x).sum().backward()


def _no_errors(page: Page) -> None:
    assert [e for e in page.console_errors if "wheel sensitivity" not in e] == []  # type: ignore[attr-defined]


def test_the_panel_lists_the_problems_and_a_click_selects_the_origin(live_server: Any, page: Page) -> None:
    tr = gradscape.Tracer(run="p", sink=str(live_server.store_path))
    sqrt_of_sqrt(tr, 0)
    tr.close()
    with TraceStore(live_server.store_path, readonly=True) as store:
        st = store.read_step("p", 0)
    assert len(st.problems) == 3
    _open(page, live_server.url)
    page.wait_for_function(f"{PANEL}.includes('3 problems')")
    lines = page.locator("#problems .gs-problem")
    assert lines.count() == 3
    for k, p in enumerate(st.problems):
        assert p.message in lines.nth(k).inner_text()
    origin = st.problems[0]
    assert origin.kind == "nonfinite_forward" and origin.node is not None
    # the page opens on the player's node: first the loss line selects the root, then the first line
    # selects the inner sqrt (two different nodes, so each click is seen to move the selection)
    root = st.problems[1].node
    assert root is not None and root != origin.node
    lines.nth(1).click()
    page.wait_for_function(f"window.cy.$(':selected').id() === 'n{root}'")
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{root},')")
    lines.nth(0).click()
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{origin.node},')")
    text = page.inner_text("#inspector")
    assert "SqrtBackward0" in text and line_of("@inner-sqrt") in text
    page.wait_for_function(f"window.cy.$(':selected').id() === 'n{origin.node}'")
    _no_errors(page)


def test_a_streamed_step_brings_its_problems_into_the_panel(live_server: Any, page: Page, make_tracer: Any) -> None:
    tr = make_tracer(run="live", sink=live_server.url)
    _finite_step(tr, 0)
    sink = tr.sinks[1]
    sink._net.wait_empty(time.monotonic() + 10)  # type: ignore[attr-defined]
    _open(page, live_server.url)
    page.wait_for_function(f"{PANEL}.includes('no problems found')")
    assert page.locator("#problems .gs-problem").count() == 0
    st = log_of_negative(tr, 1)  # while the page is open: it follows the run to step 1
    page.wait_for_function(f"{PANEL}.includes('2 problems')", timeout=10_000)
    lines = page.locator("#problems .gs-problem")
    texts = [lines.nth(k).locator(".gs-problem-text").inner_text() for k in range(2)]
    assert texts == [p.message for p in st.problems]
    assert lines.nth(0).inner_text().startswith("NaN/Inf born in the forward:")
    lines.nth(0).click()  # the selection goes into the address; the page does not read it back as a link
    origin = st.problems[0].node
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{origin},')")
    assert "LogBackward0" in page.inner_text("#inspector")
    assert page.is_checked("#follow-live input")  # a selection written into the address pins nothing
    _finite_step(tr, 2)
    page.wait_for_function(f"{PANEL}.includes('no problems found')", timeout=10_000)
    tr.close()
    _no_errors(page)
