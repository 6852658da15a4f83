"""What the page's first load costs the server: a cached layout, no dash_table bundle."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from zoo import build

import gradscape
from gradscape import TraceStore
from gradscape.app.server import ServerConfig, create_app


def _record(store: Path, steps: int) -> None:
    case = build("mlp")
    tr = gradscape.Tracer(case.model, run="r", sink=str(store))
    for i in range(steps):
        with tr.step(i):
            case.loss(case.model, case.batch).backward()
    tr.close()


def _newest_step(layout: dict) -> int:
    step = _prop(layout, "step-select", "value")
    assert isinstance(step, int)
    return step


def test_layout_is_cached_until_the_store_changes(tmp_path: Path) -> None:
    store = tmp_path / "s.sqlite"
    _record(store, 1)
    created = create_app(str(store), ServerConfig())
    app = created.dash
    try:
        c = app.server.test_client()
        first = c.get("/_dash-layout").data
        cached = app._layout_cache
        assert c.get("/_dash-layout").data == first and app._layout_cache is cached  # served, not rebuilt
        assert _newest_step(json.loads(first)) == 0
        _record(store, 2)  # the same run again: steps 0 and 1, so the key changes
        assert _newest_step(json.loads(c.get("/_dash-layout").data)) == 1
    finally:
        created.close()


def test_index_leaves_out_dash_table(tmp_path: Path) -> None:
    created = create_app(str(tmp_path / "s.sqlite"), ServerConfig())
    app = created.dash
    try:
        html = app.server.test_client().get("/").data.decode()
        assert "/dash_table/" not in html
        assert "dash_cytoscape" in html and "dash_renderer" in html
    finally:
        created.close()


def test_the_page_address_answers_at_once_and_starts_the_decode(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Dash checks the layout on the server's first request (the page's address): that check gets the page
    without a step. The address answers without waiting for the step, and starts decoding it in the
    background (`GradscapeDash.warm`); `/_dash-layout` then uses that decode: the step is read once."""
    store = tmp_path / "s.sqlite"
    _record(store, 1)
    created = create_app(str(store), ServerConfig())
    reads: list[tuple[object, ...]] = []
    reading, release = threading.Event(), threading.Event()
    read_indexed = TraceStore.read_indexed  # the page's read of a step

    def held(self: TraceStore, *args: object) -> object:  # a read that lasts until the test lets it end
        reads.append(args)
        reading.set()
        assert release.wait(30)
        return read_indexed(self, *args)

    monkeypatch.setattr(TraceStore, "read_indexed", held)
    try:
        c = created.dash.server.test_client()
        assert c.get("/").status_code == 200  # answered while the read it started is held
        assert reading.wait(30) and not release.is_set()
        assert reads == [("r", 0, 0)]
        release.set()
        layout = json.loads(c.get("/_dash-layout").data)
        assert len(reads) == 1  # the page's request used the decode the address started
        assert _newest_step(layout) == 0
        elements = _prop(layout, "graph", "elements")
        assert any("ReluBackward0" in json.dumps(e) for e in elements)  # the step is drawn in the first answer
        assert c.get("/").status_code == 200 and len(reads) == 1  # a reload decodes nothing again
    finally:
        release.set()
        created.close()


def test_the_page_answers_when_the_step_cannot_be_read(tmp_path: Path) -> None:
    """A store with no step: the address's decode finds nothing to do, and the page opens empty."""
    created = create_app(str(tmp_path / "s.sqlite"), ServerConfig())
    try:
        c = created.dash.server.test_client()
        assert c.get("/").status_code == 200
        layout = json.loads(c.get("/_dash-layout").data)
        assert _prop(layout, "graph", "elements") == []
    finally:
        created.close()


def _prop(layout: dict, component: str, prop: str) -> object:
    found = []

    def walk(c: object) -> None:
        if isinstance(c, dict):
            if c.get("props", {}).get("id") == component:
                found.append(c["props"].get(prop))
            for v in c.values():
                walk(v)
        elif isinstance(c, list):
            for v in c:
                walk(v)

    walk(layout)
    return found[0]


def test_the_layout_is_encoded_as_plotly_encodes_it_in_one_pass(tmp_path: Path) -> None:
    """`layout_json`: the bytes plotly's json engine makes of the page's layout (whose legend says "NaN/Inf",
    which sends plotly's encoder through a second pass), made in one; a non-finite number is still null."""
    from plotly.io.json import to_json_plotly

    from gradscape.app.data import PageData
    from gradscape.app.server.factory import layout_json
    from gradscape.app.ui.page import layout_function

    store = tmp_path / "s.sqlite"
    _record(store, 1)
    created = create_app(str(store), ServerConfig())
    try:
        with created.dash.server.test_request_context("/_dash-layout"), TraceStore(store, readonly=True) as ts:
            layout = layout_function(PageData(ts), None)()
        plotly_bytes = to_json_plotly(layout, engine="json").encode()
        assert b"NaN" in plotly_bytes
        assert layout_json(layout) == plotly_bytes
        served = created.dash.server.test_client().get("/_dash-layout").data
        assert _newest_step(json.loads(served)) == 0
    finally:
        created.close()
    odd = {"a": [1.5, float("nan"), float("inf")], "b": "</script>"}
    assert layout_json(odd) == to_json_plotly(odd, engine="json").encode() == \
        b'{"a":[1.5,null,null],"b":"\\u003c\\u002fscript\\u003e"}'


def test_the_graph_answer_names_nodes_by_index_and_says_no_nan(tmp_path: Path) -> None:
    """The player's order names each executed node through the step's distinct names, and a finite
    step's graph answer holds no "NaN" text, which would send plotly's encoder through a second pass (the
    legend's fixed "NaN/Inf" is in the page, not in the answer)."""
    from plotly.io.json import to_json_plotly

    from gradscape.app import view
    from gradscape.app.data import PageData
    from gradscape.app.ui import graph

    store = tmp_path / "s.sqlite"
    _record(store, 1)
    with TraceStore(store, readonly=True) as ts:
        answer = graph.graph_payload(PageData(ts), "r", 0, "norm", None)
        wire = ts.read_graph("r", 0)
    order = answer[1]
    assert order is not None and len(order["nodes"]) == len(wire["execution"]) > 0
    assert len(order["names"]) == len(set(order["names"])) < len(order["nodes"])  # some name repeats
    assert [view.order_name(order, k) for k in range(len(order["nodes"]))] == \
        [wire["nodes"][n]["name"] for n, _ in wire["execution"]]
    assert "NaN" not in to_json_plotly(list(answer), engine="json")
