"""The page's layout as a person first sees it, at 1440×900 and 1280×720, in real Chromium against a real server
holding the demo's MLP (app/demo.py, its first steps): every node of the graph in view with labels at least
9 px high, no two pieces of text overlapping, none cut off by its box, and the graph's top edge still; and
the room a person gives the graph (the timeline and the inspector folded away) kept on the next visit."""

from __future__ import annotations

from typing import Any

import pytest
from demo_page import open_page, record_demo
from page_geometry import clipped, overlapping, text_boxes
from playwright.sync_api import Page

SIZES = [(1440, 900), (1280, 720)]
LABEL_PX = 12  # the stylesheet's node label size at zoom 1 (app/ui/page.py)

IN_VIEW = """() => { const cy = window.cy, W = cy.width(), H = cy.height();
  const ops = cy.nodes().filter(n => !n.isParent());
  const out = ops.filter(n => { const b = n.renderedBoundingBox({includeLabels: true});
    return b.x1 < 0 || b.y1 < 0 || b.x2 > W || b.y2 > H; }).map(n => n.id());
  return {nodes: ops.length, out: out, zoom: cy.zoom()}; }"""


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_the_demo_opens_whole_legible_and_nothing_overlaps(live_server: Any, page: Page, size: tuple[int, int]) -> None:
    record_demo(live_server.store_path)
    page.set_viewport_size({"width": size[0], "height": size[1]})
    open_page(page, live_server.url)
    view = page.evaluate(IN_VIEW)
    assert view["nodes"] >= 16 and view["out"] == [], view  # the demo's 16 autograd nodes, every one in view
    assert view["zoom"] * LABEL_PX >= 9, view
    boxes = text_boxes(page)
    assert overlapping(boxes) == []
    assert clipped(boxes) == []


def test_the_room_given_to_the_graph_is_kept(live_server: Any, page: Page) -> None:
    """Folding the timeline and the inspector away gives the graph the room; the next visit keeps it."""
    record_demo(live_server.store_path)
    page.set_viewport_size({"width": 1440, "height": 900})  # tall enough for the timeline to start open
    open_page(page, live_server.url)
    assert page.evaluate("document.getElementById('timeline').open")
    before = page.evaluate("(() => { const r = document.getElementById('graph').getBoundingClientRect();"
                           " return [r.width, r.height]; })()")
    page.click("#timeline > summary")
    page.click("#inspector-toggle")
    page.wait_for_function(f"document.getElementById('graph').getBoundingClientRect().width > {before[0] + 300}")
    page.wait_for_function(f"document.getElementById('graph').getBoundingClientRect().height > {before[1] + 100}")
    folded = page.evaluate("(() => { const r = document.getElementById('graph').getBoundingClientRect();"
                           " return [r.width, r.height]; })()")
    open_page(page, live_server.url, inspector=False)  # the next visit (a reload) keeps the room
    page.wait_for_function(f"document.getElementById('graph').getBoundingClientRect().width === {folded[0]}")
    page.wait_for_function(f"document.getElementById('graph').getBoundingClientRect().height === {folded[1]}")
    assert not page.evaluate("document.getElementById('timeline').open")
    page.click("#inspector-toggle")  # and it comes back
    page.wait_for_function("document.querySelector('.gs-right').getBoundingClientRect().width > 300")


WIDTHS = """(() => { const w = s => document.querySelector(s).getBoundingClientRect().width;
  return {right: w('.gs-right'), graph: w('#graph'), cy: window.cy.width()}; })()"""


def test_the_split_between_graph_and_inspector_drags_and_is_kept(live_server: Any, page: Page) -> None:
    """Dragging the split gives the inspector (or the graph) the width the person chose; cytoscape draws
    into the graph's new width; the next visit keeps it; the keyboard moves it; a double-click undoes it."""
    record_demo(live_server.store_path)
    page.set_viewport_size({"width": 1440, "height": 900})
    open_page(page, live_server.url)
    before = page.evaluate(WIDTHS)
    box = page.locator("#split").bounding_box()
    assert box is not None and box["width"] >= 4
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x - 150, y, steps=5)
    page.mouse.move(x - 200, y, steps=5)
    page.mouse.up()
    page.wait_for_function(f"window.cy.width() < {before['cy'] - 150}")  # the graph's canvas follows
    dragged = page.evaluate(WIDTHS)
    assert abs(dragged["right"] - (before["right"] + 200)) <= 3, (before, dragged)
    assert abs(dragged["graph"] - (before["graph"] - 200)) <= 3, (before, dragged)

    open_page(page, live_server.url)  # the next visit keeps the width
    page.wait_for_function(f"Math.abs(document.querySelector('.gs-right').getBoundingClientRect().width"
                           f" - {dragged['right']}) <= 1")
    page.focus("#split")
    page.keyboard.press("ArrowRight")  # the inspector gives 40 px back
    page.wait_for_function(f"Math.abs(document.querySelector('.gs-right').getBoundingClientRect().width"
                           f" - {dragged['right'] - 40}) <= 1")
    page.dblclick("#split")  # as the stylesheet shares the columns
    page.wait_for_function(f"Math.abs(document.querySelector('.gs-right').getBoundingClientRect().width"
                           f" - {before['right']}) <= 1")


def test_the_split_keeps_the_graph_a_minimum(live_server: Any, page: Page) -> None:
    """Dragged to the window's left edge, the split stops where the graph keeps 320 px."""
    record_demo(live_server.store_path)
    page.set_viewport_size({"width": 1280, "height": 720})
    open_page(page, live_server.url)
    box = page.locator("#split").bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + 2, y)
    page.mouse.down()
    page.mouse.move(5, y, steps=8)
    page.mouse.up()
    page.wait_for_function("document.documentElement.classList.contains('gs-split-set')")
    got = page.evaluate(WIDTHS)
    assert 319 <= got["graph"] <= 321, got


MINIMAP = "document.getElementById('minimap').classList.contains('gs-shown')"


def test_the_minimap_shows_a_graph_bigger_than_its_panel_and_takes_the_view_there(
        live_server: Any, page: Page) -> None:
    """The demo fits its panel: no minimap. Zoomed in, part of it is out of the panel: the minimap shows,
    and a click at its top-left corner moves the view to the graph's top-left."""
    record_demo(live_server.store_path)
    page.set_viewport_size({"width": 1440, "height": 900})
    open_page(page, live_server.url)
    assert page.evaluate(MINIMAP) is False
    page.evaluate("(() => { const cy = window.cy; cy.zoom({level: 3, renderedPosition: "
                  "{x: cy.width() / 2, y: cy.height() / 2}}); })()")
    page.wait_for_function(MINIMAP)
    box = page.locator("#minimap").bounding_box()
    assert box is not None and box["width"] >= 100
    # a click where the minimap draws the graph's top-left corner centres the view there
    corner = page.evaluate("(() => { const bb = window.cy.elements().boundingBox();"
                           " return {x: bb.x1, y: bb.y1, at: window.gradscape.minimap.place(bb.x1, bb.y1)}; })()")
    assert 0 <= corner["at"]["x"] <= box["width"] and 0 <= corner["at"]["y"] <= box["height"], corner
    page.mouse.click(box["x"] + corner["at"]["x"], box["y"] + corner["at"]["y"])
    centre = ("(() => { const ex = window.cy.extent(); return [(ex.x1 + ex.x2) / 2, (ex.y1 + ex.y2) / 2]; })()")
    # within two of the minimap's pixels (a click lands on a whole pixel), in the graph's units
    bb = page.evaluate("(() => { const b = window.cy.elements().boundingBox(); return [b.w, b.h]; })()")
    tol = 2 * max(bb[0] / (box["width"] - 8), bb[1] / (box["height"] - 8))  # 2 px at the minimap's scale
    page.wait_for_function(f"(() => {{ const c = {centre}; return Math.abs(c[0] - {corner['x']}) <= {tol} &&"
                           f" Math.abs(c[1] - {corner['y']}) <= {tol}; }})()")
    page.click("#graph-fit")  # the whole graph in view again: the minimap goes
    page.wait_for_function(f"!({MINIMAP})")
