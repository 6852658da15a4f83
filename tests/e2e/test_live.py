"""The page while a run streams: a real training subprocess (tests/stream_worker.py) sends steps to a real
server, real headless Chromium shows them; what the person chose (tab, node, view, step) holds still."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from find_box import type_in_find_box
from playwright.sync_api import Page
from serving import Server, get_json, worker

import gradscape
from gradscape.tracer.blobs import decompress
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire import unpack

RUN = "stream"
# the selection (written into the address) has moved on to a new step
INSPECTOR_HAS = "t => (document.querySelector('#inspector')?.innerText || '').includes(t)"
SELECTED = "id => window.cy.$(':selected').id() === id"
URL_STEP_AT_LEAST = "s => { const m = location.search.match(/step=(\\d+)/); return !!m && parseInt(m[1]) >= s; }"


@pytest.fixture
def streaming(live_server: Any) -> Iterator[Any]:
    """A training loop streaming an MLP's steps into the server, a few a second, until the test ends."""
    proc = worker(live_server.url, RUN, "--model", "mlp", "--steps", "600", "--pause", "0.25")
    try:
        wait_steps(live_server.url, 2)
        yield live_server
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def stored_steps(url: str) -> list[int]:
    try:
        return [s["step"] for s in get_json(f"{url}/api/runs/{RUN}/steps")["steps"]]
    except Exception:  # the run is not there yet
        return []


def wait_steps(url: str, n: int, timeout: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = stored_steps(url)
        if len(steps) >= n:
            return steps
        time.sleep(0.05)
    raise TimeoutError(f"fewer than {n} steps of {RUN} stored")


def shown_step(page: Page) -> int:
    text = page.evaluate("(document.querySelector('#step-select') || {innerText: ''}).innerText").strip()
    return int(text.split()[-1]) if text.startswith("step ") else -1


def wait_shown_step_above(page: Page, step: int) -> int:
    page.wait_for_function("s => { const t = (document.querySelector('#step-select') || {innerText: ''}).innerText;"
                           " const m = t.match(/step (\\d+)/); return m && parseInt(m[1]) > s; }", arg=step,
                           timeout=20_000)
    return shown_step(page)


def module_node(store_path: Path) -> int:
    with TraceStore(store_path, readonly=True) as store:
        wire = store.read_graph(RUN, store.steps(RUN)[0]["step"])
    return next(i for i, n in enumerate(wire["nodes"]) if n["name"] == "AddmmBackward0" and n.get("module"))


def open_page(page: Page, url: str) -> None:
    page.goto(url)
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_function("(document.querySelector('#connection-status') || {innerText: ''})"
                           ".innerText.includes('live')")


def selected_tab(page: Page) -> str:
    return str(page.evaluate("(document.querySelector('#inspector-tabs .tab--selected') || {innerText: ''})"
                             ".innerText")).strip()


def clean_console(page: Page) -> None:
    assert page.console_errors == []  # type: ignore[attr-defined]
    assert page.console_warnings == []  # type: ignore[attr-defined]


def test_tab_node_view_and_scroll_hold_while_steps_stream(streaming: Any, page: Page) -> None:
    open_page(page, streaming.url)
    node = module_node(streaming.store_path)
    page.evaluate(f"void window.cy.getElementById('n{node}').emit('tap')")
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{node},')")
    # the page has focused the new node (which scrolls the inspector to the top) before the person scrolls
    page.wait_for_function(f"(window.gradscape.player.focused || '').endsWith('/{node}')")
    # a view of the person's own: zoom and pan, and the inspector scrolled down
    page.evaluate("window.cy.viewport({zoom: 0.77, pan: {x: 31, y: 17}})")
    scrolled = page.evaluate("(() => { const i = document.getElementById('inspector');"
                             " i.scrollTop = Math.min(120, i.scrollHeight - i.clientHeight); return i.scrollTop; })()")
    assert scrolled > 0
    step = wait_shown_step_above(page, shown_step(page))
    step = wait_shown_step_above(page, step)  # two new steps drawn while the node stays selected
    page.wait_for_function(URL_STEP_AT_LEAST, arg=step)  # the selection moved with them
    page.wait_for_function(SELECTED, arg=f"n{node}")  # reselected once the new step's graph is drawn
    assert page.evaluate("[window.cy.zoom(), window.cy.pan().x, window.cy.pan().y]") == pytest.approx([0.77, 31, 17])
    assert page.evaluate("document.getElementById('inspector').scrollTop") == scrolled
    # another tab: it stays chosen through new steps; only the data under it changes
    page.click("#inspector-tabs >> text=Gradient flow")
    page.wait_for_selector("#flow-chart")
    assert selected_tab(page) == "Gradient flow"
    page.evaluate("document.querySelector('#inspector-tabs .tab--selected').dataset.gsMark = 'picked'")
    step = wait_shown_step_above(page, step)
    step = wait_shown_step_above(page, step)
    page.wait_for_function(URL_STEP_AT_LEAST, arg=step)
    page.wait_for_selector("#flow-chart")
    assert selected_tab(page) == "Gradient flow"
    # the tab strip is the one the person clicked, never drawn again: a tab re-created with each streamed
    # step moved out from under the pointer (a click timed out on "element was detached from the DOM")
    assert page.evaluate("document.querySelector('#inspector-tabs .tab--selected').dataset.gsMark") == "picked"
    page.click("#inspector-tabs >> text=Module")
    page.wait_for_function("(document.querySelector('#inspector')?.innerText || '').includes('parameter gradients')")
    step = wait_shown_step_above(page, step)
    page.wait_for_function(URL_STEP_AT_LEAST, arg=step)
    assert selected_tab(page).startswith("Module")
    page.wait_for_function(SELECTED, arg=f"n{node}")  # reselected once the new step's graph is drawn
    clean_console(page)


def test_a_link_naming_a_step_pins_it(streaming: Any, page: Page) -> None:
    node = module_node(streaming.store_path)
    seen: list[int] = []
    page.on("response", lambda r: seen.append(len(r.json()["steps"])) if r.url.endswith(f"/runs/{RUN}/steps")
            and r.ok else None)
    open_page(page, f"{streaming.url}/?run={RUN}&step=0&node={node}")
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{node},')")
    assert page.is_checked("#follow-live input") is False  # visibly off
    # the page hears of newer steps (it reads the step list) and stays on step 0
    deadline = time.monotonic() + 20
    while (not seen or seen[-1] < 4) and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert seen and seen[-1] >= 4
    assert shown_step(page) == 0
    assert "step=0" in page.url
    page.wait_for_function(SELECTED, arg=f"n{node}")  # reselected once the new step's graph is drawn
    clean_console(page)


def test_a_link_naming_only_the_run_follows_live(streaming: Any, page: Page) -> None:
    open_page(page, f"{streaming.url}/?run={RUN}")
    assert page.is_checked("#follow-live input") is True
    first = shown_step(page)
    wait_shown_step_above(page, wait_shown_step_above(page, first))
    clean_console(page)


def test_the_badge_says_when_the_server_stops_and_the_page_catches_up_when_it_returns(
        tmp_path: Path, page: Page) -> None:
    from serving import Server

    from .test_ui import _record

    store = tmp_path / "s.sqlite"
    _record(store, "mlp", run="r", steps=1)
    srv = Server(store).start()
    try:
        open_page(page, srv.url)
        nodes = page.evaluate("window.cy.nodes().length")
        srv.stop()
        page.wait_for_function("(document.querySelector('#connection-status') || {innerText: ''})"
                               ".innerText.includes('offline')", timeout=10_000)
        # what the page had is still shown
        assert page.evaluate("window.cy.nodes().length") == nodes
        assert "step 0" in page.inner_text("#step-select")
        _record(store, "mlp", run="r", steps=3)  # steps stored while the page was cut off
        srv.start()
        page.wait_for_function("(document.querySelector('#connection-status') || {innerText: ''})"
                               ".innerText.includes('live')", timeout=30_000)
        page.wait_for_function("(document.querySelector('#step-select') || {innerText: ''})"
                               ".innerText.includes('step 2')", timeout=15_000)
    finally:
        srv.stop()
    # the browser logs the failed reconnection attempts while the server is away; nothing else
    errors = [e for e in page.console_errors if "ERR_CONNECTION_REFUSED" not in e  # type: ignore[attr-defined]
              and "WebSocket connection" not in e]
    assert errors == []



def test_colour_fold_find_and_player_hold_while_steps_stream(streaming: Any, page: Page) -> None:
    """What else the person set up holds through new steps: the colouring, a folded module, a node found
    by name, and the player's place in the backward order (the graph is the same in every step)."""
    open_page(page, streaming.url)
    # colour by the fraction of zeros
    before = page.evaluate("window.cy.nodes().map(n => n.data('color')).join()")
    page.click("#color-by")
    page.get_by_text("fraction of zeros", exact=True).click()
    page.wait_for_function(f"window.cy.nodes().map(n => n.data('color')).join() !== {before!r}")
    # fold fc1 (a click on its box)
    page.wait_for_function("window.cy.getElementById('g:fc1').length === 1")
    page.evaluate("void window.cy.getElementById('g:fc1').emit('tap')")
    page.wait_for_function("window.cy.getElementById('m:fc1').length === 1")
    # the player: three back from the end (which selects its node)
    page.click("#graph-info")  # the keys act when no field has the focus
    last = page.evaluate("window.gradscape.player.current.position")
    for _ in range(3):
        page.keyboard.press("ArrowLeft")
    page.wait_for_function(f"window.gradscape.player.current.position === {last - 3}")
    # the player's element is painted (a streamed step may have just replaced the graph's elements)
    current = page.wait_for_function("() => { const c = window.cy.$('.current'); return c.length === 1 && c.id(); }"
                                     ).json_value()
    # find fc2's weight by name
    with TraceStore(streaming.store_path, readonly=True) as store:
        wire = store.read_graph(RUN, store.steps(RUN)[0]["step"])
    weight = next(i for i, n in enumerate(wire["nodes"]) if n.get("param") == "fc2.weight")
    type_in_find_box(page, "fc2.weight")
    page.get_by_text("AccumulateGrad · fc2.weight", exact=False).first.click()
    page.wait_for_function(f"window.cy.$(':selected').id() === 'n{weight}'")
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{weight},')")
    step = wait_shown_step_above(page, shown_step(page))
    step = wait_shown_step_above(page, step)
    page.wait_for_function(URL_STEP_AT_LEAST, arg=step)
    # the graph drawn is that step's or a later one's (the run streams on while this waits)
    page.wait_for_function("s => { const m = (window.gradscape.graph.key || '').match(/^" + RUN + "\\/(\\d+)$/);"
                           " return !!m && parseInt(m[1]) >= s; }", arg=step)
    assert "fraction of zeros" in page.inner_text("#color-by")
    assert "exactly 0" in page.inner_text("#legend")  # its title: "fraction of ∂L/∂output that is exactly 0"
    assert page.evaluate("[window.cy.getElementById('m:fc1').length, window.cy.getElementById('g:fc1').length]") \
        == [1, 0]
    # the player reselects once it has the drawn step's elements (a newer step may be being drawn meanwhile)
    page.wait_for_function(SELECTED, arg=f"n{weight}")
    assert f"(node n{weight}," in page.inner_text("#inspector")
    page.wait_for_function(f"window.gradscape.player.current.position === {last - 3}")
    page.wait_for_function(f"window.cy.$('.current').id() === '{current}'")  # painted again on each new step
    clean_console(page)


def test_a_gradscape_serve_page_draws_the_streamed_steps(tmp_path: Path, page: Page) -> None:
    """The page as `gradscape serve` answers it, while a run streams into it: its address answers without the
    step (Dash's first-request check), `/_dash-layout` draws the newest one, and each new step, decoded
    and frozen out of the collector's reach (NOTE [Kept frozen]), is drawn as it arrives."""
    srv = Server(tmp_path / "serve.sqlite").start()
    proc = worker(srv.url, RUN, "--model", "mlp", "--steps", "600", "--pause", "0.25")
    try:
        wait_steps(srv.url, 2)
        open_page(page, srv.url)
        page.wait_for_function("(document.querySelector('#step-select') || {innerText: ''}).innerText"
                               ".startsWith('step ')")  # the dropdown's script loads after the first paint
        first = shown_step(page)
        assert first >= 0 and page.evaluate("window.cy.nodes().length") > 3
        labels = page.evaluate("window.cy.nodes().map(n => n.data('label'))")
        assert {"fc1 (Linear)", "Addmm", "NllLoss"} <= set(labels)
        later = wait_shown_step_above(page, first)
        page.wait_for_function("window.cy && window.cy.nodes().length > 3")
        assert later > first
        clean_console(page)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
        srv.stop()


def test_a_step_streamed_as_columns_shows_its_stored_gradients(tmp_path: Path, page: Page) -> None:
    """A natively recorded step reaches `gradscape serve` as columns (NOTE [Column document]) while the run
    streams on: a link to one of its nodes shows that node's stored heatmaps (the node read alone from the
    columns, the step's other nodes left unread), and a search over every node finds a parameter's."""
    srv = Server(tmp_path / "serve.sqlite").start()
    proc = worker(srv.url, RUN, "--model", "mlp", "--steps", "600", "--pause", "0.25")
    try:
        step = wait_steps(srv.url, 2)[0]
        with sqlite3.connect(srv.store) as db:
            (blob,) = db.execute("SELECT graph FROM steps WHERE run=? AND step=?", (RUN, step)).fetchone()
        assert "columns" in unpack(decompress(blob))  # stored as the tracer sent it: columns
        st = gradscape.load(srv.store, RUN, step)
        addmm = next(n for n in st.nodes if n.name == "AddmmBackward0" and n.module == "fc2")
        page.goto(f"{srv.url}/?run={RUN}&step={step}&node={addmm.id}")
        page.wait_for_function(INSPECTOR_HAS, arg=f"(node n{addmm.id},")
        page.wait_for_selector("#inspector .js-plotly-plot")
        assert "mat2 → fc2.weight (transposed)" in page.inner_text("#inspector")
        z = page.evaluate("Array.from(document.querySelectorAll('#inspector .js-plotly-plot'))"
                          ".map(gd => gd._fullData[0].z)")
        want = [t.thumb for t in [addmm.grad_outputs[0], *addmm.grad_inputs] if t is not None and t.thumb is not None]
        assert len(z) == len(want) == 4
        for got, ref in zip(z, want):
            assert np.allclose(np.array(got, dtype=float), np.atleast_2d(ref), atol=1e-6)
        weight = next(n.id for n in st.nodes if n.param == "fc2.weight")
        type_in_find_box(page, "fc2.weight")
        page.get_by_text("AccumulateGrad · fc2.weight", exact=False).first.click()
        page.wait_for_function(f"window.cy.$(':selected').id() === 'n{weight}'")
        page.wait_for_function(INSPECTOR_HAS, arg=f"(node n{weight},")
        clean_console(page)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
        srv.stop()


def test_the_find_box_of_a_big_step_searches_on_the_server_while_steps_stream(live_server: Any, page: Page) -> None:
    """An LSTMCell loop's steps of about 2,500 nodes stream in: typed in the find box, a node's id is searched on
    the server (the step's `SearchTable`, read from its columns) and picked; the node is selected and in the
    inspector, and stays selected as newer steps arrive."""
    proc = worker(live_server.url, RUN, "--model", "lstm:2500", "--steps", "300", "--pause", "0.5")
    try:
        wait_steps(live_server.url, 2)
        open_page(page, live_server.url)
        node = 1234  # not among the first options of a step past 2,000 nodes: only the server's search finds it
        type_in_find_box(page, f"n{node})")
        page.get_by_text(f"(n{node})", exact=False).first.click()
        page.wait_for_function(SELECTED, arg=f"n{node}")
        page.wait_for_function(INSPECTOR_HAS, arg=f"(node n{node},")
        step = wait_shown_step_above(page, shown_step(page))
        page.wait_for_function(URL_STEP_AT_LEAST, arg=step)
        page.wait_for_function(SELECTED, arg=f"n{node}")
        clean_console(page)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
