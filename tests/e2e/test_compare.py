"""Ranks in the page, in real Chromium: two gloo ranks stream into the real server; selecting rank 1 and
opening the compare view shows a parameter gradient equal on both ranks after DDP's all-reduce, and in
red as a desync when the ranks skipped the all-reduce."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from distributed_runs import run_ranks
from playwright.sync_api import Page

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")


def _compare_rank_1(page: Page, url: str, run: str) -> str:
    page.goto(f"{url}/?run={run}&step=1")
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_selector("#rank-field", state="visible")  # two ranks: the rank select is shown
    page.click("#rank-select")
    page.click("text=rank 1")
    page.wait_for_function("(document.querySelector('#rank-select') || {innerText: ''}).innerText.includes('rank 1')")
    page.click("#compare-open")
    page.wait_for_selector("#compare-view", state="visible")
    page.wait_for_function("(document.querySelector('#compare-result h3') || {innerText: ''}).innerText"
                           ".includes('rank 1 step 1 − rank 0 step 1')")
    assert "parameter" in page.inner_text("#compare-target")
    page.wait_for_selector("#compare-result .gs-compare-heatmap .main-svg")
    return page.inner_text("#compare-status")


def test_compare_ranks_after_all_reduce_and_without(live_server: Any, page: Page, tmp_path: Path) -> None:
    run_ranks(live_server.url, "ddp", "ddp", tmp_path / "ddp")
    status = _compare_rank_1(page, live_server.url, "ddp")
    assert "no difference" in status
    assert "full values" in page.inner_text("#compare-result .gs-compare-basis")
    stats = page.inner_text("#compare-result .gs-stats")
    assert "max |A − B|" in stats and "0 of" in stats  # no cell differs
    assert page.locator("#compare-status.gs-desync").count() == 0

    run_ranks(live_server.url, "desync", "desync", tmp_path / "desync")  # a plain model per rank: no all-reduce
    status = _compare_rank_1(page, live_server.url, "desync")
    assert "desync" in status
    color = page.evaluate("getComputedStyle(document.querySelector('#compare-status')).color")
    assert color == "rgb(208, 0, 0)"  # shown in red
    errors = [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]
    assert errors == []
