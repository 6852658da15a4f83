"""The timeline in real Chromium while a real training process streams its history to a real server:
every step is drawn, the triggered step is marked in red with its reason, the plot grows as rows
arrive without undoing the person's zoom, and a click on a traced step opens it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from history_stream import history_rows, streaming_history
from playwright.sync_api import Page

RUN = "tl"
SPIKE = 25

FIGURE = "() => document.querySelector('#timeline-graph .js-plotly-plot')"
POINTS = ("() => { const gd = document.querySelector('#timeline-graph .js-plotly-plot');"
          " return gd && gd.data && gd.data.length ? gd.data[0].x.length : 0; }")


@pytest.fixture
def streaming(live_server: Any) -> Iterator[Any]:
    with streaming_history(live_server.url, RUN, lambda: len(history_rows(live_server.url, RUN)) > SPIKE + 5,
                           "--steps", "3000", "--every", "1000", "--spike", str(SPIKE), "--pause", "0.02"):
        yield live_server


def test_timeline_grows_keeps_the_zoom_and_opens_a_triggered_step(streaming: Any, page: Page) -> None:
    page.goto(streaming.url)
    page.wait_for_selector("#timeline")
    page.wait_for_function(f"() => ({POINTS})() > {SPIKE}")
    marks = page.evaluate(f"() => {{ const gd = ({FIGURE})(); const t = gd.data.find(d => d.name === 'traced');"
                          " return t ? {x: t.x, text: t.text, color: t.marker.color} : null; }")
    assert marks is not None and SPIKE in marks["x"]
    k = marks["x"].index(SPIKE)
    assert marks["text"][k] == "loss_spike" and marks["color"][k] == "#d62728"  # red, with its reason
    assert marks["text"][marks["x"].index(0)] == ""  # step 0: scheduled, not triggered
    # the person zooms in (a drag across the plot)
    box = page.locator("#timeline-graph .nsewdrag").first.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.3, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=8)
    page.mouse.up()
    assert page.evaluate(f"() => ({FIGURE})().layout.xaxis.autorange") is False
    zoomed = page.evaluate(f"() => ({FIGURE})().layout.xaxis.range.slice()")
    n = page.evaluate(POINTS)
    page.wait_for_function(f"() => ({POINTS})() > {n + 20}", timeout=60_000)  # it grew while the run streams
    assert page.evaluate(f"() => ({FIGURE})().layout.xaxis.range.slice()") == zoomed  # the zoom held
    page.evaluate(f"() => {{ const gd = ({FIGURE})(); Plotly.relayout(gd, {{'xaxis.autorange': true}}); }}")
    page.wait_for_function(f"() => ({FIGURE})().layout.xaxis.autorange === true")
    # a click on the triggered step's mark opens it
    xy = page.evaluate(f"""() => {{ const gd = ({FIGURE})(); const t = gd.data.find(d => d.name === 'traced');
        const k = t.x.indexOf({SPIKE}); const fl = gd._fullLayout; const r = gd.getBoundingClientRect();
        return [r.left + fl.xaxis._offset + fl.xaxis.d2p(t.x[k]),
                r.top + fl.yaxis._offset + fl.yaxis.d2p(t.y[k])]; }}""")
    page.mouse.click(xy[0], xy[1])
    page.wait_for_function(f"() => (document.querySelector('#step-select') || {{innerText: ''}}).innerText"
                           f".includes('step {SPIKE}')", timeout=30_000)
    assert not [e for e in page.console_errors if "favicon" not in e]  # type: ignore[attr-defined]


def test_a_trigger_that_fires_while_the_page_is_open_gets_its_label(live_server: Any, page: Page,
                                                                     tmp_path: Path) -> None:
    """The page is drawn before the spike (the loop holds there until the test lets it go); the trigger's
    label joins the timeline as its row streams in, as it would on a page opened after it."""
    go, spike = tmp_path / "go", 120  # rows are flushed at least once a second: some arrive before the hold
    with streaming_history(live_server.url, RUN, lambda: len(history_rows(live_server.url, RUN)) >= 40,
                           "--steps", "3000", "--every", "1000", "--spike", str(spike), "--pause", "0.02",
                           "--hold", str(go)):
        page.goto(live_server.url)
        page.wait_for_function(f"() => ({POINTS})() >= 40")
        labels = f"() => (({FIGURE})().layout.annotations || []).map(a => a.text)"
        assert page.evaluate(labels) == []
        go.touch()
        page.wait_for_function(f"() => ({labels})().includes('loss_spike')")
        top = page.evaluate(f"() => ({FIGURE})().layout.margin.t")
        assert top > 6, top  # the margin above the plot has grown to hold the label row
