"""A module of 10,000 ops of its own (a recurrence written out in one forward, called once) opens into runs of
its ops, in real headless Chromium on a real server and store (app/view/op_runs.py): the click draws the
first 50 runs folded (`scan · ops 101–200 of 10,402`) and one node for the rest, a run opens into its ops,
that node draws 50 more, the box folds the run back, and the player lights the run that holds its node.
Before, the module stayed folded ("it would draw over 10,000 nodes"): nothing to click into."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from playwright.sync_api import Page

import gradscape

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from tests.app.test_op_runs import Model  # noqa: E402
from tests.e2e.test_call_folds import _click, _open, _play_to_module  # noqa: E402

RUNS_DRAWN = "window.cy.nodes().filter(n => n.id().startsWith('o:scan#0.')).length"


def _record_scan(store: Path, steps: int) -> gradscape.StepTrace:
    torch.manual_seed(0)
    model = Model()
    with gradscape.Tracer(model, run="scan", sink=str(store), tensors="summary") as tr, tr.step(0):
        model(torch.randn(steps, 2, 4)).pow(2).mean().backward()
    return gradscape.load(store, "scan", 0)


def test_a_scan_of_ten_thousand_ops_opens_into_runs_and_a_run_into_its_ops(live_server: Any, page: Page) -> None:
    st = _record_scan(live_server.store_path, 2_600)
    own = sum(1 for n in st.nodes if n.module == "scan" or (n.param or "").startswith("scan."))
    assert own > 10_000
    _open(page, live_server.url)
    start = time.monotonic()
    _click(page, "m:scan")
    page.wait_for_function(f"{RUNS_DRAWN} > 0", timeout=30_000)
    took = time.monotonic() - start
    assert took < 5.0, f"first expand of a 10k-op scan took {took:.1f} s"  # bench/ui.py has the figures
    assert page.evaluate(RUNS_DRAWN) == 51  # 50 runs of 100 ops and the rest
    assert page.evaluate("window.cy.getElementById('o:scan#0.2').data('label')") == f"scan\nops 101–200 of {own:,}"
    assert page.evaluate("window.cy.getElementById('o:scan#0.more').data('label')") == \
        f"scan\nops 5,001–{own:,} of {own:,}"
    assert page.evaluate("window.cy.getElementById('o:scan#0.2').parent().id()") == "g:scan"
    assert "stays folded" not in page.inner_text("#graph-info")
    ops = page.evaluate("window.cy.getElementById('o:scan#0.2').data('ranges')"
                        ".flatMap(r => Array.from({length: r[1] - r[0] + 1}, (_, i) => r[0] + i))")
    assert len(ops) == 100 and all(st.nodes[n].module == "scan" for n in ops)
    page.evaluate("""() => { window.__said = []; const info = document.querySelector('#graph-info');
      new MutationObserver(() => window.__said.push(info.innerText))
        .observe(info, {subtree: true, childList: true, characterData: true}); }""")
    _click(page, "o:scan#0.2")
    page.wait_for_function("ids => window.cy.getElementById('o:scan#0.2').length === 0 && "
                           "ids.every(n => window.cy.getElementById('n' + n).length === 1)", arg=ops)
    assert page.evaluate(RUNS_DRAWN) == 50  # the other runs stay folded
    assert any(t.startswith(f"opening scan · ops 101–200 of {own:,}") for t in page.evaluate("window.__said"))
    _click(page, "o:scan#0.more")
    page.wait_for_function("window.cy.getElementById('o:scan#0.100').length === 1")  # 50 more runs drawn
    assert page.evaluate("window.cy.getElementById('o:scan#0.more').data('label')") == \
        f"scan\nops 10,001–{own:,} of {own:,}"
    assert page.evaluate("window.cy.getElementById('o:scan#0.2').length") == 0  # the opened run stays open
    # the box folds the run back first, then the module
    page.evaluate("void window.cy.getElementById('g:scan').emit('tap')")
    page.wait_for_function("window.cy.getElementById('o:scan#0.2').length === 1")
    page.evaluate("void window.cy.getElementById('g:scan').emit('tap')")
    page.wait_for_function("window.cy.getElementById('m:scan').length === 1")
    assert [e for e in page.console_errors if "wheel sensitivity" not in e] == []  # type: ignore[attr-defined]


def test_the_player_lights_the_run_that_holds_its_node(live_server: Any, page: Page) -> None:
    st = _record_scan(live_server.store_path, 400)
    _open(page, live_server.url)
    _click(page, "m:scan")
    page.wait_for_function(f"{RUNS_DRAWN} > 0")
    _play_to_module(page, st, "scan")  # the scan's first op backward ran
    assert page.evaluate("window.gradscape.player.current.element") == "o:scan#0.1"
    page.wait_for_function("window.cy.getElementById('o:scan#0.1').hasClass('current')")
