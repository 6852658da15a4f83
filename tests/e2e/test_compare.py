"""Ranks in the page, in real Chromium: two gloo ranks stream into the real server; selecting rank 1 and
opening the compare view shows a parameter gradient equal on both ranks after DDP's all-reduce, and in
red as a desync when the ranks skipped the all-reduce. The rank selected drives the whole page (graph,
inspector, address, step list, "follow live"), checked against what the store holds for each rank."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from distributed_runs import run_ranks
from earlier_release import step_to_wire
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

import gradscape
from gradscape.app import view
from gradscape.tracer import protocol
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire import pack

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")

RANK_SHOWN = "r => (document.querySelector('#rank-select') || {innerText: ''}).innerText.includes('rank ' + r)"
STEP_SHOWN = "s => (document.querySelector('#step-select') || {innerText: ''}).innerText.trim() === 'step ' + s"
# the first heatmap of the inspector (grad_outputs[0] of the node shown) holds `want` (a 2-D list)
HEATMAP_HOLDS = """want => { const gd = document.querySelector('#inspector .js-plotly-plot');
    const z = gd && gd._fullData && gd._fullData[0] && gd._fullData[0].z;
    if (!z || z.length !== want.length) return false;
    return want.every((row, i) => z[i].length === row.length &&
                                  row.every((v, j) => Math.abs(z[i][j] - v) <= 1e-6 + 1e-5 * Math.abs(v))); }"""
# the value each autograd node of the graph shows (its colour's statistic, as text)
GRAPH_VALUES = "Object.fromEntries(window.cy.nodes().filter(n => /^n[0-9]+$/.test(n.id()))" \
               ".map(n => [n.id(), n.data('value_text')]))"
# the graph shows `want` (node id → value text) on every autograd node: waited on whole, as the graph's values may
# arrive after the selects, the inspector, and any one node that reads the same in the step shown before
GRAPH_HOLDS = ("want => { if (!window.cy) return false; const got = " + GRAPH_VALUES + "; return "
               "Object.keys(got).length === Object.keys(want).length && "
               "Object.entries(want).every(([k, v]) => got[k] === v); }")


def _choose_rank(page: Page, rank: int) -> None:
    """Open the rank select and pick `rank`. The select's options come from a callback of the step just
    opened: a click that lands while they are replaced opens a menu that the new options close again (CI
    once saw "rank 1" found but never visible for 45 s), so the menu is opened again until the option shows."""
    option = page.locator("#rank-field").get_by_text(f"rank {rank}", exact=True)
    for _ in range(5):
        page.click("#rank-select")
        try:
            option.wait_for(state="visible", timeout=5_000)
        except PlaywrightTimeout:
            continue
        option.click()
        break
    page.wait_for_function(RANK_SHOWN, arg=rank)


def _graph_values(wire: dict[str, Any]) -> dict[str, str]:
    """What the graph shows for each autograd node of a stored step (the page colours by ‖grad‖)."""
    return {e["data"]["id"]: e["data"]["value_text"] for e in view.cytoscape_elements(wire, view.layout_graph(wire))
            if e["group"] == "nodes" and e["data"]["id"][1:].isdigit()}


def _compare_rank_1(page: Page, url: str, run: str) -> str:
    page.goto(f"{url}/?run={run}&step=1")
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_selector("#rank-field", state="visible")  # two ranks: the rank select is shown
    _choose_rank(page, 1)
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


def test_rank_1_drives_the_graph_the_inspector_and_the_address(live_server: Any, page: Page, tmp_path: Path) -> None:
    """DDP ranks see their own batches: their parameter gradients agree after the all-reduce, what arrives at
    the other nodes does not. Choosing rank 1 shows rank 1's stored gradients and writes rank=1 into the
    address; that address opens rank 1."""
    run_ranks(live_server.url, "ddp", "ddp", tmp_path / "ddp")
    with TraceStore(live_server.store_path, readonly=True) as store:
        wires = {r: store.read_graph("ddp", 1, r) for r in (0, 1)}
        steps = {r: store.read_step("ddp", 1, r) for r in (0, 1)}
    arrived = {r: {n.id: np.atleast_2d(n.grad_outputs[0].values) for n in steps[r].nodes
                   if n.grad_outputs and n.grad_outputs[0] is not None and n.grad_outputs[0].values is not None}
               for r in (0, 1)}
    node = next(nid for nid, _ in wires[1]["execution"]  # the first node to run where the ranks differ
                if nid in arrived[0] and not np.allclose(arrived[0][nid], arrived[1][nid]))
    want = {r: arrived[r][node].tolist() for r in (0, 1)}
    values = {r: _graph_values(wires[r]) for r in (0, 1)}
    assert values[0] != values[1]

    page.goto(f"{live_server.url}/?run=ddp&step=1&node={node}")
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_function(HEATMAP_HOLDS, arg=want[0])  # rank 0's gradient, as opened
    page.wait_for_function(GRAPH_HOLDS, arg=values[0])
    _choose_rank(page, 1)
    page.wait_for_function(HEATMAP_HOLDS, arg=want[1])  # the same node, rank 1's gradient
    page.wait_for_function(GRAPH_HOLDS, arg=values[1])  # the graph is rank 1's
    page.wait_for_function("location.search.includes('rank=1')")
    assert page.evaluate("location.search") == f"?run=ddp&rank=1&step=1&node={node}"
    assert "rank 1 of 2" in page.inner_text("#inspector")
    page.wait_for_function("id => window.cy.$(':selected').id() === id", arg=f"n{node}")  # the selection stayed

    with TraceStore(live_server.store_path, readonly=True) as store:
        wire0, step0 = store.read_graph("ddp", 0, 1), store.read_step("ddp", 0, 1)
        rank0_step0 = _graph_values(store.read_graph("ddp", 0, 0))
    assert rank0_step0 != _graph_values(wire0)  # (so the graph's wait below tells the ranks apart)
    page.goto(f"{live_server.url}/?run=ddp&rank=1&step=0&node={node}")  # a link to rank 1 opens rank 1
    page.wait_for_function(RANK_SHOWN, arg=1)
    page.wait_for_function(STEP_SHOWN, arg=0)
    page.wait_for_function(HEATMAP_HOLDS, arg=np.atleast_2d(step0.nodes[node].grad_outputs[0].values).tolist())
    page.wait_for_function(GRAPH_HOLDS, arg=_graph_values(wire0))
    page.wait_for_function("id => window.cy.$(':selected').id() === id", arg=f"n{node}")
    assert page.is_checked("#follow-live input") is False  # the link names a step: it is pinned
    errors = [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]
    assert errors == []


class _Rank:
    """One rank's connection to the server's `/tracer` namespace, sending steps as the tracer's live sink
    does (tracer/sinks/socket.py); each step is a real trace of a small model on this rank's own batch."""

    def __init__(self, url: str, run: str, rank: int, world: int = 2) -> None:
        import socketio

        self.run, self.rank, self.world, self.seq = run, rank, world, 0
        self.client = socketio.Client(reconnection=False, logger=False, engineio_logger=False)
        self.client.connect(url, namespaces=["/tracer"], transports=["websocket"], wait_timeout=10)
        ack = self._call("hello", {"client": "test", "accepts": [protocol.PROTOCOL_VERSION], "pid": rank, "host": "h"})
        assert ack["ok"], ack

    def _call(self, event: str, payload: dict[str, Any]) -> Any:
        self.seq += 1
        return self.client.call(event, protocol.envelope(event, self.run, self.seq, payload), namespace="/tracer",
                                timeout=30)

    def send(self, step: int) -> None:
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(10 * self.rank + step))
        tr = gradscape.Tracer(model, run=self.run)
        with tr.step(step) as st:
            model(x).pow(2).sum().backward()
        tr.close()
        assert st is not None
        wire = {**step_to_wire(st), "rank": self.rank, "world_size": self.world}
        ack = self._call("step_chunk", {"step": step, "chunk": 0, "chunks": 1, "data": pack(wire)})
        assert ack["ok"] and ack["stored"], ack

    def close(self) -> None:
        self.client.disconnect()


def test_follow_live_follows_the_newest_step_of_the_rank_shown(live_server: Any, page: Page) -> None:
    """Rank 0 runs ahead of rank 1: on rank 1 the step list is rank 1's and "follow live" moves with rank 1
    only. A rank that starts streaming after the page opened joins the rank select."""
    heard: list[Any] = []  # the page's reads of rank 1's step list
    page.on("response", lambda r: heard.append(r.json()) if r.url.endswith("/api/runs/live/steps?rank=1") and r.ok
            else None)
    ranks = {r: _Rank(live_server.url, "live", r) for r in (0, 1)}
    try:
        ranks[0].send(0)
        page.goto(live_server.url)
        page.wait_for_function("window.cy && window.cy.nodes().length > 0")
        page.wait_for_function("(document.querySelector('#connection-status') || {innerText: ''})"
                               ".innerText.includes('live')")
        assert not page.is_visible("#rank-field")  # one rank so far
        ranks[1].send(0)
        page.wait_for_selector("#rank-field", state="visible")
        _choose_rank(page, 1)
        page.wait_for_function("location.search.includes('rank=1')")
        ranks[1].send(1)
        page.wait_for_function(STEP_SHOWN, arg=1)
        page.wait_for_function("window.gradscape.graph.key === 'live/1/rank 1'")  # rank 1's step 1 drawn
        before = len(heard)
        ranks[0].send(1)
        ranks[0].send(2)  # rank 0 is ahead: the page hears of it, reads rank 1's list again and stays
        deadline = time.monotonic() + 20
        while len(heard) == before and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        assert len(heard) > before
        assert [s["step"] for s in heard[-1]["steps"]] == [0, 1] and heard[-1]["rank"] == 1
        assert heard[-1]["ranks"] == [0, 1]
        assert page.evaluate("window.gradscape.graph.key") == "live/1/rank 1"
        assert page.inner_text("#step-select").strip() == "step 1"
        ranks[1].send(2)  # the same step number, one rank after the other: the page hears both
        page.wait_for_function(STEP_SHOWN, arg=2)
        page.wait_for_function("window.gradscape.graph.key === 'live/2/rank 1'")
        page.wait_for_function("location.search.includes('rank=1&step=2')")  # the selection moved with it
        assert "rank 1 of 2" in page.inner_text("#inspector")
    finally:
        for r in ranks.values():
            r.close()
    errors = [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]
    assert errors == []
