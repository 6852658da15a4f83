"""A module called many times opens into its calls, in real headless Chromium on a real server and store
(app/view/call_folds.py): an `nn.LSTMCell` loop's cell, clicked, draws its first calls folded
(`cell · call 17 of 52`) and a "more" node; a call opens into its ops; "more" draws the next calls. A
10k-node loop answers its first click within a generous bound (the real figures: bench/ui.py --loop)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import Page

import gradscape

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench/ is not a package of the distribution: import it from the checkout
    sys.path.insert(0, str(REPO))
from bench.workloads import lstm_loop  # noqa: E402

CALLS_DRAWN = "m => window.cy.nodes().filter(n => n.id().startsWith('c:' + m + '#') && n.data('call')).length"


def _record_loop(store: Path, nodes: int) -> int:
    """One step of bench/workloads.py's LSTMCell loop of about `nodes` autograd nodes; its cell's calls."""
    wl = lstm_loop(nodes)
    with gradscape.Tracer(wl.model, run="loop", sink=str(store), tensors="summary") as tr, tr.step(0):
        wl.loss(wl.model, wl.batch()).backward()
    return int(wl.batch()[0].shape[0])


def _open(page: Page, url: str) -> None:
    page.goto(url)
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_function("window.gradscape.graph && window.gradscape.graph.opened")


def _click(page: Page, element: str) -> None:
    """A person's click on `element`, brought into view first."""
    page.wait_for_function("id => window.cy.getElementById(id).length === 1", arg=element)
    at = page.evaluate("""(id) => { const n = window.cy.getElementById(id); window.cy.center(n);
      const r = n.renderedPosition(), box = window.cy.container().getBoundingClientRect();
      return {x: box.left + r.x, y: box.top + r.y}; }""", element)
    page.mouse.click(at["x"], at["y"])


def test_the_folded_loop_opens_into_its_calls_a_call_into_its_ops_and_more_draws_more(
        live_server: Any, page: Page) -> None:
    calls = _record_loop(live_server.store_path, 900)
    assert calls > 50
    _open(page, live_server.url)
    _click(page, "m:cell")
    page.wait_for_function(f"({CALLS_DRAWN})('cell') === 50")
    assert page.evaluate("window.cy.getElementById('m:cell').length") == 0
    label = page.evaluate("window.cy.getElementById('c:cell#17').data('label')")
    assert label.startswith(f"cell · call 17 of {calls}\nLSTMCell · ") and label.endswith(" nodes")
    assert page.evaluate("window.cy.getElementById('c:cell#17').parent().id()") == "g:cell"
    more = page.evaluate("window.cy.getElementById('c:cell#more').data('label')")
    assert more.startswith(f"cell · calls 51–{calls}")
    # a call opens into its ops
    ops = page.evaluate("window.cy.getElementById('c:cell#3').data('ranges')"
                        ".flatMap(r => Array.from({length: r[1] - r[0] + 1}, (_, i) => r[0] + i))")
    assert len(ops) > 5
    _click(page, "c:cell#3")
    page.wait_for_function("ids => window.cy.getElementById('c:cell#3').length === 0 && "
                           "ids.every(n => window.cy.getElementById('n' + n).length === 1)", arg=ops)
    assert page.evaluate(f"({CALLS_DRAWN})('cell')") == 49  # the others stay folded
    # in a box of its own, inside the loop's, labelled as the call
    assert page.evaluate(f"window.cy.getElementById('n{ops[0]}').parent().id()") == "g:cell#3"
    assert page.evaluate("window.cy.getElementById('g:cell#3').parent().id()") == "g:cell"
    assert page.evaluate("window.cy.getElementById('g:cell#3').data('label')") == f"cell · call 3 of {calls}"
    # "more" draws the next calls (all the rest here)
    _click(page, "c:cell#more")
    page.wait_for_function(f"window.cy.getElementById('c:cell#{calls}').length === 1")
    assert page.evaluate("window.cy.getElementById('c:cell#more').length") == 0
    assert page.evaluate("window.cy.getElementById('c:cell#3').length") == 0  # the opened call stays open
    # the call's box folds it back alone, every call staying drawn (a tap on the box itself: its middle is
    # covered by what it holds); the loop's box folds the calls opened back first (app/view/folds.py), then
    # the whole loop
    _click(page, "c:cell#5")
    page.wait_for_function("window.cy.getElementById('g:cell#5').length === 1")
    page.evaluate("void window.cy.getElementById('g:cell#3').emit('tap')")
    page.wait_for_function("window.cy.getElementById('c:cell#3').length === 1")
    assert page.evaluate("window.cy.getElementById('g:cell#5').length") == 1  # call 5 stays open
    assert page.evaluate(f"({CALLS_DRAWN})('cell')") == calls - 1
    page.evaluate("void window.cy.getElementById('g:cell').emit('tap')")
    page.wait_for_function("window.cy.getElementById('c:cell#5').length === 1")
    assert page.evaluate(f"({CALLS_DRAWN})('cell')") == calls
    page.evaluate("void window.cy.getElementById('g:cell').emit('tap')")
    page.wait_for_function("window.cy.getElementById('m:cell').length === 1")
    assert page.evaluate(f"({CALLS_DRAWN})('cell')") == 0
    assert [e for e in page.console_errors if "wheel sensitivity" not in e] == []  # type: ignore[attr-defined]


def test_a_ten_thousand_node_loop_opens_at_its_first_click(live_server: Any, page: Page) -> None:
    """The click that took 40 s or never answered: the cell of a 10k-node loop (about 590 calls). The bound
    here is generous (a shared 2-core box); the figures are bench/ui.py's."""
    calls = _record_loop(live_server.store_path, 10_000)
    assert calls > 500
    _open(page, live_server.url)
    page.wait_for_function("window.cy.getElementById('m:cell').length === 1")
    # what the line under the graph says meanwhile: the click is answered at once, in words
    page.evaluate("""() => { window.__said = []; const info = document.querySelector('#graph-info');
      new MutationObserver(() => window.__said.push(info.innerText))
        .observe(info, {subtree: true, childList: true, characterData: true}); }""")
    start = time.monotonic()
    _click(page, "m:cell")
    page.wait_for_function(f"({CALLS_DRAWN})('cell') === 50 && "
                           "window.cy.getElementById('c:cell#more').length === 1", timeout=30_000)
    took = time.monotonic() - start
    assert took < 5.0, f"first expand of a 10k-node loop took {took:.1f} s"
    label = page.evaluate("window.cy.getElementById('c:cell#more').data('label')")
    assert label.startswith(f"cell · calls 51–{calls}")
    assert any(t.startswith("opening cell") for t in page.evaluate("window.__said"))


def test_the_player_lights_the_fold_that_holds_its_node_under_more(live_server: Any, page: Page) -> None:
    """The backward pass starts at the loop's last call, which is not drawn yet when `cell` opens (calls 1-50
    drawn): the player's node there lights the "more" node that holds it, not nothing."""
    calls = _record_loop(live_server.store_path, 900)
    assert calls > 50
    st = gradscape.load(live_server.store_path, "loop", 0)
    _open(page, live_server.url)
    _click(page, "m:cell")
    page.wait_for_function(f"({CALLS_DRAWN})('cell') === 50")
    _play_to_module(page, st, "cell")  # the first op of the last call
    assert page.evaluate("window.gradscape.player.current.element") == "c:cell#more"
    page.wait_for_function("window.cy.getElementById('c:cell#more').hasClass('current')")


def _play_to_module(page: Page, st: gradscape.StepTrace, module: str, limit: int = 40) -> None:
    """The player to the first node of `module` in the backward order, as a person moves it: the slider's
    handle, Home, then → until its node is one of the module's (past the loss and the read-out)."""
    page.locator("#player-slider [role=slider]").first.click()
    page.keyboard.press("Home")
    page.wait_for_function("window.gradscape.player.current.position === 0")
    page.click("#graph-info")  # the arrow keys step the player when no field has the focus
    for position in range(1, limit):
        node = page.evaluate("window.gradscape.player.current.node")
        if st.nodes[node].module == module:
            return
        page.keyboard.press("ArrowRight")
        page.wait_for_function(f"window.gradscape.player.current.position === {position}")
    raise AssertionError(f"no node of {module} in the first {limit} the player ran")
