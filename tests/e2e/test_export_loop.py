"""The offline file of a loop, opened from disk in real headless Chromium (every other request refused): a
click on the folded `cell` (an LSTMCell called 70 times) draws its calls, a click on a call its ops, one
on the calls not drawn yet the rest, one on the box folds it all; a fold past the file's budget says
why it does not open (app/export/views.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

import gradscape

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.workloads import lstm_loop  # noqa: E402
from tests.e2e.test_export import _open  # noqa: E402


@pytest.fixture(scope="module")
def loop_step() -> Any:
    w = lstm_loop(70 * 17)
    with gradscape.Tracer(w.model) as tr, tr.step(0) as st:
        w.loss(w.model, w.batch()).backward()
    return st


def _ids(page: Page) -> set[str]:
    return set(page.locator("#graph .gs-node").evaluate_all("els => els.map(e => e.dataset.id)"))


def test_a_loop_opens_call_by_call_and_its_box_folds_it(page: Page, loop_step: Any, tmp_path: Path) -> None:
    path = loop_step.to_html(tmp_path / "loop.html")
    _open(page, path)
    page.locator('#graph [data-id="m:cell"]').click()
    page.wait_for_selector('#graph [data-id="c:cell#3"]')
    calls = {e for e in _ids(page) if e.startswith("c:cell#")}
    assert calls == {f"c:cell#{k}" for k in range(1, 51)} | {"c:cell#more"}
    assert "call 3 of 70" in page.locator('#graph [data-id="c:cell#3"] text').first.text_content()
    before = _ids(page)
    page.locator("#graph-fit").click()  # 50 calls run down the page: the whole view, as a person would
    page.locator('#graph [data-id="c:cell#3"]').click()
    page.wait_for_selector('#graph [data-id="c:cell#3"]', state="detached")
    ops = {int(e[1:]) for e in _ids(page) - before if e.startswith("n")}
    assert len(ops) >= 10 and all(loop_step.nodes[i].module == "cell" for i in ops)
    page.locator("#graph-fit").click()
    page.locator('#graph [data-id="c:cell#more"]').click()
    page.wait_for_selector('#graph [data-id="c:cell#70"]')
    assert "click a fold to open it" in page.locator("#graph-info").inner_text()
    page.locator("#graph-fit").click()
    page.locator('#graph .gs-box[data-module="cell"] rect').click(position={"x": 2, "y": 2})
    page.wait_for_selector('#graph [data-id="m:cell"]')
    assert not any(e.startswith("c:") for e in _ids(page))


def test_a_fold_past_the_files_budget_says_so(page: Page, loop_step: Any, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import gradscape.app.export.views as export_views

    monkeypatch.setattr(export_views, "STATE_WORK", 1)  # the first view only
    path = loop_step.to_html(tmp_path / "small.html")
    _open(page, path)
    drawn = _ids(page)
    page.locator('#graph [data-id="m:cell"]').click()
    page.wait_for_function("document.querySelector('#graph-info').textContent.includes('not laid out in this file')")
    assert "gradscape serve" in page.locator("#graph-info").inner_text() and _ids(page) == drawn
