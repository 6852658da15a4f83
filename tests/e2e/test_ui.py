"""The debugger page in real headless Chromium against a real server and a real trace file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from find_box import type_in_find_box
from playwright.sync_api import Page
from zoo import build

import gradscape
from gradscape.app import view
from gradscape.tracer.store import TraceStore


def _record(store: Path, name: str = "mlp", run: str = "r", steps: int = 2, mode: str = "full") -> None:
    case = build(name)
    tr = gradscape.Tracer(case.model, run=run, sink=str(store), tensors=mode)
    for i in range(steps):
        with tr.step(i):
            case.loss(case.model, case.batch).backward()
    tr.close()


def _open(page: Page, url: str) -> None:
    """The page, opened: the graph drawn, the player placed, and the page done loading, its socket live and
    its timeline drawn. (Loading plotly's bundle and drawing the first figure hold the browser's main
    thread for about 0.75 s here, after the graph is up; the socket's handshake waits for them. A step
    streamed in that time showed up to a second late, in a test that times what a person waits for once
    the page is open: the page's open time is bench/ui.py's to measure.)"""
    page.goto(url)
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_function("(document.querySelector('#backward-player') || {innerText: ''}).innerText.includes(' of ')")
    page.wait_for_function("(document.querySelector('#connection-status') || {innerText: ''}).innerText"
                           ".includes('live')")
    page.wait_for_function("document.querySelector('#timeline-graph .main-svg') !== null")


def _graph_counts(page: Page) -> tuple[int, int]:
    n, e = page.evaluate("[window.cy.nodes().length, window.cy.edges().length]")
    return int(n), int(e)


def _no_errors(page: Page) -> None:
    assert page.console_errors == []  # type: ignore[attr-defined]
    assert page.console_warnings == []  # type: ignore[attr-defined]


def test_page_loads_and_graph_matches_the_store(live_server: Any, page: Page) -> None:
    _record(live_server.store_path, "transformer")
    _open(page, live_server.url)
    with TraceStore(live_server.store_path, readonly=True) as store:
        wire = store.read_graph("r", 1)  # the newest step opens
    expected = view.cytoscape_elements(wire, view.layout_graph(wire))
    nodes = sum(1 for e in expected if e["group"] == "nodes")
    edges = sum(1 for e in expected if e["group"] == "edges")
    assert _graph_counts(page) == (nodes, edges)
    ops = page.evaluate("window.cy.nodes().filter(n => n.id().startsWith('n')).length")
    assert ops == len(wire["nodes"])  # a small graph: every autograd node is drawn
    assert page.inner_text("#step-select").strip() == "step 1"
    assert "live" in page.inner_text("#connection-status")
    # the legend on one line: its scale (from the graph's callback) and its fixed part (the page's)
    legend = page.evaluate("""() => { const row = document.querySelector('.gs-legend');
      const boxes = [...row.querySelectorAll('span, .bar')].map(e => e.getBoundingClientRect());
      return {text: row.innerText, tops: boxes.map(b => Math.round(b.top + b.height / 2)),
              bar: row.querySelector('.bar').getBoundingClientRect().width}; }""")
    assert "∂L/∂output" in legend["text"] and "red border: NaN/Inf" in legend["text"], legend
    assert legend["bar"] > 100 and max(legend["tops"]) - min(legend["tops"]) <= 2, legend
    _no_errors(page)


def test_deep_link_opens_the_inspector_with_the_stored_values(live_server: Any, page: Page) -> None:
    _record(live_server.store_path, "mlp")
    with TraceStore(live_server.store_path, readonly=True) as store:
        st = store.read_step("r", 0)
    addmm = next(n for n in st.nodes if n.name == "AddmmBackward0" and n.module == "fc2")
    page.goto(f"{live_server.url}/?run=r&step=0&node={addmm.id}")
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{addmm.id},')")
    page.wait_for_selector("#inspector .js-plotly-plot")
    text = page.inner_text("#inspector")
    assert "AddmmBackward0" in text and "mat2 → fc2.weight (transposed)" in text
    assert "Arriving: grad_outputs" in text and "Sent on: grad_inputs" in text
    # the heatmaps hold the stored gradients: grad_outputs[0], then the three grad_inputs
    z = page.evaluate("Array.from(document.querySelectorAll('#inspector .js-plotly-plot'))"
                      ".map(gd => gd._fullData[0].z)")
    want = [addmm.grad_outputs[0].values] + [g.values for g in addmm.grad_inputs]
    assert len(z) == len(want)
    for got, ref in zip(z, want):
        ref2 = np.atleast_2d(ref)
        assert np.allclose(np.array(got, dtype=float), ref2, atol=1e-6)
    assert page.evaluate("window.cy.$(':selected').id()") == f"n{addmm.id}"
    _no_errors(page)


def test_player_steps_through_the_execution_order(live_server: Any, page: Page) -> None:
    _record(live_server.store_path, "mlp")
    _open(page, live_server.url)
    with TraceStore(live_server.store_path, readonly=True) as store:
        wire = store.read_graph("r", 1)
    order = [f"n{n}" for n, _ in wire["execution"]]
    page.wait_for_function(f"window.cy.$('.current').id() === '{order[-1]}'")  # opens at the last node
    for k in range(3):  # step back three times: the highlight walks back along the order
        page.click("#player-prev")
        want = order[-2 - k]
        page.wait_for_function(f"window.cy.$('.current').id() === '{want}'")
        page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node {want}')")
    executed = page.evaluate("window.cy.$('.executed').map(n => n.id())")
    assert set(executed) == set(order[:-3])
    pending = page.evaluate("window.cy.$('node.pending').map(n => n.id())")
    assert set(pending) == set(order[-3:]) - {order[-4]}
    incoming = page.evaluate("window.cy.$('edge.incoming').map(e => e.data('target'))")
    assert incoming and set(incoming) == {order[-4]}
    page.click("#player-play")
    page.wait_for_function(f"window.cy.$('.current').id() !== '{order[-4]}'", timeout=10_000)
    page.click("#player-play")
    _no_errors(page)


def test_a_streamed_step_appears_within_two_seconds(live_server: Any, page: Page, make_tracer: Any) -> None:
    case = build("mlp")
    tr = make_tracer(case.model, run="live", sink=live_server.url)
    with tr.step(0):
        case.loss(case.model, case.batch).backward()
    tr.sinks[1]._net.wait_empty(time.monotonic() + 10)  # type: ignore[attr-defined]
    _open(page, live_server.url)
    for i in (1, 2):
        with tr.step(i):
            case.loss(case.model, case.batch).backward()
        sink = tr.sinks[1]
        deadline = time.monotonic() + 10
        while i not in sink.acked and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)
        t_stored = time.monotonic()
        # (null-safe: an async dcc component briefly swaps its placeholder for the loaded one)
        page.wait_for_function(f"(document.querySelector('#step-select') || {{innerText: ''}})"
                               f".innerText.includes('step {i}')", timeout=5_000)
        assert time.monotonic() - t_stored < 2.0
    tr.close()
    _no_errors(page)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(x)


class _Deep(nn.Module):
    def __init__(self, blocks: int = 700) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def test_a_four_thousand_node_trace_opens_collapsed(live_server: Any, page: Page) -> None:
    torch.manual_seed(0)
    model = _Deep()
    tr = gradscape.Tracer(model, run="deep", sink=str(live_server.store_path), thumb=8)
    with tr.step(0):
        model(torch.randn(2, 4)).sum().backward()
    tr.close()
    with TraceStore(live_server.store_path, readonly=True) as store:
        wire = store.read_graph("deep", 0)
    assert len(wire["nodes"]) >= 4000
    t0 = time.monotonic()
    _open(page, live_server.url)
    opened = time.monotonic() - t0
    nodes, _ = _graph_counts(page)
    assert nodes <= 300, f"{nodes} elements drawn for {len(wire['nodes'])} autograd nodes"
    assert "folded" in page.inner_text("#graph-info")
    before = nodes
    first = page.evaluate("window.cy.nodes().filter(n => n.id().startsWith('m:')).map(n => n.id())[0]")
    page.evaluate(f"void window.cy.getElementById('{first}').emit('tap')")
    page.wait_for_function(f"window.cy.nodes().length > {before}")
    assert opened < 60
    _no_errors(page)


def test_screenshot_for_the_readme(live_server: Any, page: Page, tmp_path: Path) -> None:
    _record(live_server.store_path, "transformer", mode="full")
    with TraceStore(live_server.store_path, readonly=True) as store:
        wire = store.read_graph("r", 1)
    node = next(n["id"] for n in wire["nodes"] if n["name"] == "AddmmBackward0")
    page.goto(f"{live_server.url}/?run=r&step=1&node={node}")
    page.wait_for_selector("#inspector .js-plotly-plot")
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_function(f"window.cy.$(':selected').id() === 'n{node}'")
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{node},')")
    out = Path(os.environ.get("GRADSCAPE_SCREENSHOT", tmp_path / "page.png"))
    page.screenshot(path=str(out))
    # the picture shows the page: a PNG of the viewport's size, the graph drawn (its canvas holds more than
    # one colour), the inspector's heatmaps there
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (1500, 950)
    colours = page.evaluate("""(() => { const c = document.querySelector('#graph canvas:last-of-type');
        const all = Array.from(document.querySelectorAll('#graph canvas'));
        const seen = new Set();
        for (const cv of all) { const g = cv.getContext('2d'); if (!g || !cv.width) continue;
          const d = g.getImageData(0, 0, cv.width, cv.height).data;
          for (let i = 0; i < d.length; i += 4 * 97) if (d[i + 3]) seen.add(d[i] + ',' + d[i + 1] + ',' + d[i + 2]); }
        return seen.size; })()""")
    assert colours > 3
    assert page.locator("#inspector .js-plotly-plot").count() >= 2
    assert page.locator("#inspector").is_visible() and page.locator("#graph").is_visible()
    _no_errors(page)


def test_first_load_asks_the_server_only_for_the_search_options(live_server: Any, page: Page) -> None:
    """The layout already holds the newest step, so no callback redoes it on load: the round trips are
    the search index (kept out of the layout: the first paint does not need it) and, once the socket
    is up, the run's step list read from the JSON API (the server's catch-up; nothing to catch up
    here, so the step shown stays)."""
    _record(live_server.store_path, "mlp")
    posts: list[Any] = []
    api: list[str] = []
    page.on("request", lambda r: posts.append(r) if "_dash-update-component" in r.url else None)
    page.on("request", lambda r: api.append(r.url) if "/api/" in r.url else None)
    _open(page, live_server.url)
    page.wait_for_function("(document.querySelector('#connection-status') || {innerText: ''})"
                           ".innerText.includes('live')")
    page.wait_for_function("document.querySelector('#search') !== null")
    deadline = time.monotonic() + 15  # the search options' answer and the catch-up's read of the step list
    while (not api or not any(r.response() for r in posts)) and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    outputs = {json.loads(r.post_data)["output"].split("@")[0]: r for r in posts}
    # the timeline reads the run's history once (its panel draws every step, traced or not); nothing else
    assert sorted(o for o in outputs if "timeline-graph" not in o) == ["search.options"], list(outputs)
    assert len(outputs) == 2, list(outputs)
    with TraceStore(live_server.store_path, readonly=True) as store:
        wire = store.read_graph("r", 1)
    answer = outputs["search.options"].response()
    assert answer is not None
    assert answer.json()["response"]["search"]["options"] == view.search_index(wire)
    assert len(posts) == 2  # the search options and the timeline, once each
    assert [u.split("/api/", 1)[1] for u in api] == ["runs/r/steps"]
    assert page.inner_text("#step-select").strip() == "step 1"
    _no_errors(page)


def test_a_token_page_goes_live_over_a_websocket(token_server: Any, page: Page) -> None:
    _record(token_server.store_path, "mlp")
    sockets: list[str] = []
    api: list[Any] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.on("response", lambda r: api.append(r) if "/api/" in r.url else None)
    _open(page, token_server.url)
    page.wait_for_function("(document.querySelector('#connection-status') || {innerText: ''})"
                           ".innerText.includes('live')")
    assert len(sockets) == 1 and "transport=websocket" in sockets[0]
    # the catch-up's read of the step list carries the token (the cookie the ?token visit set)
    deadline = time.monotonic() + 5
    while not api and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert [r.status for r in api] == [200], [(r.url, r.status) for r in api]
    _no_errors(page)


def test_a_new_run_appears_in_the_run_list_and_the_shown_run_stays(live_server: Any, page: Page,
                                                                  make_tracer: Any) -> None:
    _record(live_server.store_path, "mlp", run="first", steps=1)
    _open(page, live_server.url)
    page.wait_for_function("(document.querySelector('#connection-status') || {innerText: ''})"
                           ".innerText.includes('live')")
    # the dropdown opened first (its options are in the page only while it is open): the time below is the
    # server's push and the page's answer to it, not Playwright's click on a loaded machine
    page.click("#run-select")
    page.wait_for_selector("text=first (1 steps)", timeout=5_000)
    case = build("mlp")
    tr = make_tracer(case.model, run="second", sink=live_server.url)
    with tr.step(0):
        case.loss(case.model, case.batch).backward()
    sink = tr.sinks[1]
    deadline = time.monotonic() + 10
    while 0 not in sink.acked and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)
    t_stored = time.monotonic()
    page.wait_for_selector("text=second (1 steps)", timeout=5_000)
    assert time.monotonic() - t_stored < 2.0
    page.keyboard.press("Escape")
    assert "first" in page.inner_text("#run-select")  # the run shown did not change under the user
    tr.close()
    _no_errors(page)


def test_a_reconnecting_page_catches_up_on_steps_it_was_not_told_about(live_server: Any, page: Page) -> None:
    _record(live_server.store_path, "mlp", steps=1)
    _open(page, live_server.url)
    page.wait_for_function("(document.querySelector('#connection-status') || {innerText: ''})"
                           ".innerText.includes('live')")
    _record(live_server.store_path, "mlp", steps=2)  # written to the file directly: no notification
    for sock in list(live_server.state.notifier.socketio.server.eio.sockets.values()):
        sock.close(wait=False, abort=True)  # the page's socket drops and reconnects
    page.wait_for_function("(document.querySelector('#step-select') || {innerText: ''}).innerText.includes('step 1')",
                           timeout=15_000)
    _no_errors(page)


def test_a_run_that_began_while_the_page_was_not_listening_is_shown_on_reconnecting(live_server: Any,
                                                                                   page: Page) -> None:
    """A run whose `run` notification went to nobody on this page (it began between the page being served and
    its socket connecting, or while the page was offline): the catch-up names it, and the page, which showed
    no run, shows it with its steps."""
    page.goto(live_server.url)
    page.wait_for_function("(document.querySelector('#connection-status') || {innerText: ''})"
                           ".innerText.includes('live')")
    assert "no runs yet" in page.inner_text("#run-select")
    _record(live_server.store_path, "mlp", run="late", steps=2)  # written to the file directly: no notification
    for sock in list(live_server.state.notifier.socketio.server.eio.sockets.values()):
        sock.close(wait=False, abort=True)  # the page's socket drops and reconnects
    page.wait_for_function("(document.querySelector('#run-select') || {innerText: ''}).innerText.includes('late')",
                           timeout=15_000)
    page.wait_for_function("(document.querySelector('#step-select') || {innerText: ''}).innerText.includes('step 1')",
                           timeout=15_000)
    page.wait_for_function("window.cy && window.cy.nodes('[node]').length > 0", timeout=15_000)
    _no_errors(page)


def test_on_load_the_player_and_the_inspector_show_the_same_node(live_server: Any, page: Page) -> None:
    _record(live_server.store_path, "mlp")
    _open(page, live_server.url)
    player = page.inner_text("#player-info")
    shown = player.rsplit("(", 1)[1].rstrip(")")  # "#14 of 15: Name (n3)" -> "n3"
    assert page.evaluate("window.cy.$('.current').id()") == shown
    assert f"(node {shown}," in page.inner_text("#inspector")
    _no_errors(page)


def test_keys_step_play_fit_and_clear_but_not_while_typing(live_server: Any, page: Page) -> None:
    _record(live_server.store_path, "mlp")
    _open(page, live_server.url)
    with TraceStore(live_server.store_path, readonly=True) as store:
        wire = store.read_graph("r", 1)
    order = [f"n{n}" for n, _ in wire["execution"]]
    page.wait_for_function(f"window.cy.$('.current').id() === '{order[-1]}'")
    page.click("#graph-info")  # the page has the focus, no field
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(f"window.cy.$('.current').id() === '{order[-2]}'")
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(f"window.cy.$('.current').id() === '{order[-3]}'")
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node {order[-3]},')")
    page.keyboard.press("ArrowRight")
    page.wait_for_function(f"window.cy.$('.current').id() === '{order[-2]}'")
    page.keyboard.press(" ")
    page.wait_for_function("document.querySelector('#player-play').title.startsWith('pause')")
    page.keyboard.press(" ")
    page.wait_for_function("document.querySelector('#player-play').title.startsWith('play')")
    page.evaluate("window.cy.viewport({zoom: 3, pan: {x: -4000, y: -4000}})")
    page.keyboard.press("f")  # the whole graph in view
    page.wait_for_function("(() => { const e = window.cy.extent(), b = window.cy.elements().boundingBox();"
                           " return e.x1 <= b.x1 && e.y1 <= b.y1 && e.x2 >= b.x2 && e.y2 >= b.y2; })()")
    page.keyboard.press("Escape")
    page.wait_for_function("window.cy.$(':selected').length === 0")
    page.wait_for_function("(document.querySelector('#inspector')?.innerText || '').includes('Click a node')")
    # typing in the find box moves nothing
    current = page.evaluate("window.cy.$('.current').id()")
    zoom = page.evaluate("window.cy.zoom()")
    type_in_find_box(page, "f")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press(" ")
    assert page.evaluate("window.cy.$('.current').id()") == current
    assert page.evaluate("window.cy.zoom()") == zoom
    assert page.get_attribute("#player-play", "title") == "play (space)"
    _no_errors(page)


def test_at_1280_by_720_the_page_does_not_scroll_sideways(live_server: Any, page: Page) -> None:
    _record(live_server.store_path, "transformer")
    page.set_viewport_size({"width": 1280, "height": 720})
    _open(page, live_server.url)
    page.wait_for_function("(document.querySelector('#inspector')?.innerText || '').includes('(node n')")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    _no_errors(page)
