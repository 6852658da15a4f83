"""What the page's first load costs the server: a cached layout, no dash_table bundle."""

from __future__ import annotations

import json
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


def test_the_page_address_answers_without_decoding_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dash checks the layout on the server's first request (the page's address): that check gets the page
    without a step, and only `/_dash-layout` decodes it, once, with the step drawn in."""
    store = tmp_path / "s.sqlite"
    _record(store, 1)
    created = create_app(str(store), ServerConfig())
    reads: list[tuple[object, ...]] = []
    read_graph = TraceStore.read_graph

    def counted(self: TraceStore, *args: object) -> object:
        reads.append(args)
        return read_graph(self, *args)

    monkeypatch.setattr(TraceStore, "read_graph", counted)
    try:
        c = created.dash.server.test_client()
        assert c.get("/").status_code == 200
        assert reads == []
        layout = json.loads(c.get("/_dash-layout").data)
        assert len(reads) == 1
        assert _newest_step(layout) == 0
        elements = _prop(layout, "graph", "elements")
        assert any("ReluBackward0" in json.dumps(e) for e in elements)  # the step is drawn in the first answer
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
