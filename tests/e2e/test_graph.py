"""The graph view in real headless Chromium: label contrast, module boxes, a first view that can be read,
the full label on hover, and a 10,000-node trace (folded modules readable, one click expands one)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from find_box import type_in_find_box
from playwright.sync_api import Page

import gradscape

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench/ is not a package of the distribution: import it from the checkout
    sys.path.insert(0, str(REPO))
from bench.workloads import lstm_loop, residual_stages  # noqa: E402

LEGIBLE_PX = 9.0  # labels at least 9 px high on screen (issue 49)


def _record_demo(store: Path, name: str, run: str = "r") -> None:
    """One step of the `gradscape demo` model `name`, traced as the demo traces it."""
    from gradscape.app import demo

    model, batch = demo.make(name)
    x, y = batch()
    tr = gradscape.Tracer(model, run=run, sink=str(store), tensors="summary")
    with tr.step(0):
        out = model(x)
        F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
    tr.close()


def _open(page: Page, url: str) -> None:
    page.goto(url)
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_function("(document.querySelector('#backward-player') || {innerText: ''}).innerText.includes(' of ')")
    page.wait_for_function("window.gradscape.graph && window.gradscape.graph.opened")


def _no_errors(page: Page) -> None:
    errors = [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]
    assert errors == []


def _rgb(css: str) -> tuple[float, float, float]:
    parts = css[css.index("(") + 1:css.index(")")].split(",")
    r, g, b = (float(p) for p in parts[:3])
    return r, g, b


def _contrast(a: str, b: str) -> float:
    def lum(c: str) -> float:
        lin = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in (x / 255 for x in _rgb(c))]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


# the drawn label colour and what it sits on: a box's label is above the box, on the page
LABEL_STYLES = """
() => window.cy.nodes().map(n => ({id: n.id(), label: n.data('label'), color: n.style('color'),
  fill: n.hasClass('module') ? getComputedStyle(document.querySelector('.gs-graph-wrap')).backgroundColor
                             : n.style('background-color'),
  opacity: n.style('background-opacity')}))
"""


def test_every_label_has_aa_contrast_in_every_colour_mode(live_server: Any, page: Page) -> None:
    _record_demo(live_server.store_path, "mlp")
    _open(page, live_server.url)
    view = page.evaluate("[window.cy.zoom(), window.cy.pan()]")
    for mode, text in (("norm", None), ("maxabs", "max |grad|"), ("zeros", "fraction of zeros")):
        if text:
            before = page.evaluate("window.cy.nodes().map(n => n.data('color')).join()")
            page.click("#color-by")
            page.get_by_text(text, exact=True).click()
            page.wait_for_function(f"window.cy.nodes().map(n => n.data('color')).join() !== {before!r}")
        styles = page.evaluate(LABEL_STYLES)
        assert len(styles) >= 16
        for s in styles:
            fill = "rgb(255, 255, 255)" if s["fill"] in ("rgba(0, 0, 0, 0)", "transparent") else s["fill"]
            assert _contrast(s["color"], fill) >= 4.5, (mode, s)
    assert page.evaluate("[window.cy.zoom(), window.cy.pan()]") == view  # a new colouring keeps the view
    _no_errors(page)


SIBLING_OVERLAPS = """
() => {
  const boxes = window.cy.nodes('.module').map(n => ({id: n.id(), parent: n.data('parent') || null,
    bb: n.boundingBox({includeLabels: false, includeOverlays: false})}));
  const out = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    if (a.parent !== b.parent) continue;
    if (a.bb.x1 < b.bb.x2 && b.bb.x1 < a.bb.x2 && a.bb.y1 < b.bb.y2 && b.bb.y1 < a.bb.y2) out.push([a.id, b.id]);
  }
  return {count: boxes.length, overlaps: out};
}
"""


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_sibling_module_boxes_do_not_intersect(live_server: Any, page: Page, name: str) -> None:
    _record_demo(live_server.store_path, name)
    _open(page, live_server.url)
    got = page.evaluate(SIBLING_OVERLAPS)
    assert got["count"] >= 3 and got["overlaps"] == [], got
    _no_errors(page)



def test_transformer_opens_legible_and_hover_shows_the_full_label(live_server: Any, page: Page) -> None:
    _record_demo(live_server.store_path, "transformer")
    _open(page, live_server.url)
    view = page.evaluate("""() => {
      const cy = window.cy, ext = cy.extent(), bb = cy.elements().renderedBoundingBox();
      const shown = cy.nodes().filter(n => !n.isParent() && n.visible()).filter(n => {
        const p = n.position(); return p.x >= ext.x1 && p.x <= ext.x2 && p.y >= ext.y1 && p.y <= ext.y2; });
      return {nodes: cy.nodes().length, shown: shown.length, width: cy.width(), used: Math.min(bb.x2, cy.width())
              - Math.max(bb.x1, 0), px: shown.map(n => parseFloat(n.style('font-size')) * cy.zoom())};
    }""")
    assert view["nodes"] >= 120 and view["shown"] >= 5
    assert min(view["px"]) >= LEGIBLE_PX, view["px"]
    assert view["used"] >= 0.6 * view["width"], view  # not a narrow column in a wide panel
    # a parameter whose label is cut short on the node: hovering shows all of it (once the view is still:
    # the page may be bringing the player's node into view)
    page.wait_for_function("!window.cy.animated()")
    target = page.evaluate("""() => {
      const n = window.cy.nodes('.leaf, .param').filter(n => n.data('label').length > 28)[0];
      window.cy.center(n);
      const p = n.renderedPosition(), box = window.cy.container().getBoundingClientRect();
      return {label: n.data('label'), x: box.left + p.x, y: box.top + p.y};
    }""")
    page.mouse.move(target["x"], target["y"])
    page.wait_for_function("(document.getElementById('graph-hover') || {style: {}}).style.display === 'block'")
    assert target["label"] in page.inner_text("#graph-hover")
    page.evaluate("""(label) => { window.cy.zoom(0.1);  // at any zoom: here labels are not drawn at all
      window.cy.center(window.cy.nodes().filter(n => n.data('label') === label)[0]); }""", target["label"])
    page.wait_for_function("document.getElementById('graph-hover').style.display === 'none'")
    p = page.evaluate("""(label) => { const n = window.cy.nodes().filter(n => n.data('label') === label)[0];
      const r = n.renderedPosition(), box = window.cy.container().getBoundingClientRect();
      return {x: box.left + r.x, y: box.top + r.y}; }""", target["label"])
    page.mouse.move(5, 5)  # off the graph, then back onto the node
    page.mouse.move(p["x"] + 1, p["y"] + 1)
    page.wait_for_function("document.getElementById('graph-hover').style.display === 'block'")
    assert target["label"] in page.inner_text("#graph-hover")
    _no_errors(page)


def _record_residual_stages(store: Path) -> None:
    """One step of bench's scale model: 1,450 residual blocks in 50 top-level stages, about 10,150 nodes."""
    model = residual_stages()
    tr = gradscape.Tracer(model, run="big", sink=str(store), tensors="summary", thumb=4)
    with tr.step(0):
        model(torch.randn(2, 4)).sum().backward()
    tr.close()


def test_ten_thousand_nodes_folded_readable_expand_fit_and_zoom(live_server: Any, page: Page) -> None:
    _record_residual_stages(live_server.store_path)
    _open(page, live_server.url)
    info = page.inner_text("#graph-info")
    assert int(info.split(" autograd")[0]) > 10_000 and "50 modules folded" in info
    folded = page.evaluate("""() => { const cy = window.cy, ext = cy.extent();
      return cy.nodes('.collapsed').filter(n => { const p = n.position();
        return p.y >= ext.y1 && p.y <= ext.y2 && p.x >= ext.x1 && p.x <= ext.x2; })
      .map(n => ({id: n.id(), label: n.data('label'), px: parseFloat(n.style('font-size')) * cy.zoom(),
                  shown: n.style('label') !== '' && n.style('min-zoomed-font-size')}));}""")
    assert len(folded) >= 3
    for f in folded:
        name, kind = f["label"].split("\n")
        assert name == f["id"][2:] and kind.startswith("Sequential · ") and kind.endswith(" nodes"), f
        assert f["px"] >= LEGIBLE_PX, f
    # a person's click on a folded stage opens it (its 29 blocks, folded)
    before = page.evaluate("window.cy.nodes().length")
    target = page.evaluate("""(id) => { const n = window.cy.getElementById(id), r = n.renderedPosition(),
      box = window.cy.container().getBoundingClientRect(); return {x: box.left + r.x, y: box.top + r.y}; }""",
                           folded[0]["id"])
    t0 = time.monotonic()
    page.mouse.click(target["x"], target["y"])
    # the clicked stage is drawn open: its box, and more nodes than before (the click's answer may
    # come as more than one change of the graph's elements)
    page.wait_for_function(f"window.cy.getElementById('g:{folded[0]['id'][2:]}').length === 1 && "
                           f"window.cy.nodes().length > {before}", timeout=20_000)
    expanded = time.monotonic() - t0
    assert expanded < 10, expanded  # the ≤ 1 s figure is measured by bench/ui.py
    # "fit" shows the whole graph
    page.click("#graph-fit")
    page.wait_for_function("""() => { const e = window.cy.extent(), b = window.cy.elements().boundingBox();
      return e.x1 <= b.x1 + 1 && e.y1 <= b.y1 + 1 && e.x2 >= b.x2 - 1 && e.y2 >= b.y2 - 1; }""")
    # "zoom to selection" brings the selected node into view, at a zoom where it can be read
    # (the page opens with the player's node selected: only the chosen one stays selected)
    page.evaluate("window.cy.elements(':selected').unselect(); window.cy.nodes('.collapsed').last().select()")
    page.click("#graph-zoom-selection")
    page.wait_for_function("""() => { const cy = window.cy, n = cy.nodes(':selected'), e = cy.extent();
      const p = n.position(), px = parseFloat(n.style('font-size')) * cy.zoom();
      return p.x > e.x1 && p.x < e.x2 && p.y > e.y1 && p.y < e.y2 && px >= 10; }""")
    # the search box holds a few options of so big a step; what is typed is searched on the server
    assert page.evaluate("document.querySelectorAll('#search').length") == 1
    type_in_find_box(page, "37.12.lin.weight")
    page.get_by_text("AccumulateGrad · 37.12.lin.weight", exact=False).first.wait_for()
    _no_errors(page)


def test_a_streamed_step_keeps_the_view_the_person_chose(live_server: Any, page: Page, make_tracer: Any) -> None:
    from zoo import build

    case = build("mlp")
    tr = make_tracer(case.model, run="live", sink=live_server.url)
    with tr.step(0):
        case.loss(case.model, case.batch).backward()
    sink = tr.sinks[1]
    sink._net.wait_empty(time.monotonic() + 10)  # type: ignore[attr-defined]
    _open(page, live_server.url)
    page.click("#graph-fit")
    page.evaluate("window.cy.zoom({level: 2.2, renderedPosition: {x: 200, y: 150}})")  # the person zooms in
    view = page.evaluate("[window.cy.zoom(), window.cy.pan()]")
    with tr.step(1):
        case.loss(case.model, case.batch).backward()
    page.wait_for_function("(document.querySelector('#step-select') || {innerText: ''}).innerText.includes('step 1')",
                           timeout=10_000)
    page.wait_for_function("window.gradscape.graph.key === 'live/1'", timeout=10_000)
    assert page.evaluate("[window.cy.zoom(), window.cy.pan()]") == view
    tr.close()
    _no_errors(page)


SHOWN = """() => { const cy = window.cy, out = {};
  cy.nodes().forEach(n => { if (n.isParent()) return; const p = n.renderedPosition();
    if (p.x >= 0 && p.x <= cy.width() && p.y >= 0 && p.y <= cy.height()) out[n.id()] = [p.x, p.y]; });
  return out; }"""


def test_first_expand_draws_the_module_and_keeps_what_was_shown(live_server: Any, page: Page) -> None:
    """A person's first click on a folded stage (nothing of it laid out before): the stage's box is drawn
    with its blocks, sibling boxes do not overlap, nothing that was shown moves sideways, and what was
    above it stays in place relative to the rest (the view at most scrolls to show the opened box)."""
    model = residual_stages(stages=8)
    tr = gradscape.Tracer(model, run="big", sink=str(live_server.store_path), tensors="summary", thumb=4)
    with tr.step(0):
        model(torch.randn(2, 4)).sum().backward()
    tr.close()
    _open(page, live_server.url)
    assert page.evaluate("window.cy.getElementById('m:4').length") == 1  # the stages open folded
    at = page.evaluate("""() => { const cy = window.cy, n = cy.getElementById('m:4');
      cy.center(n); const r = n.renderedPosition(), box = cy.container().getBoundingClientRect();
      return {x: box.left + r.x, y: box.top + r.y, top: r.y}; }""")
    shown = page.evaluate(SHOWN)
    assert len(shown) >= 5
    t0 = time.monotonic()
    page.mouse.click(at["x"], at["y"])
    page.wait_for_function("window.cy.getElementById('g:4').children().length === 29", timeout=20_000)
    took = time.monotonic() - t0
    assert took < 10, took  # the ≤ 1 s figure is measured by bench/ui.py
    page.wait_for_function("!window.gradscape.graph.tapped")  # the view has been placed
    got = page.evaluate(SIBLING_OVERLAPS)
    assert got["count"] >= 1 and got["overlaps"] == [], got
    now = page.evaluate("""(ids) => { const out = {}; ids.forEach(id => { const n = window.cy.getElementById(id);
      if (n.length) { const p = n.renderedPosition(); out[id] = [p.x, p.y]; } }); return out; }""", list(shown))
    kept = [e for e in shown if e in now and e != "m:4"]
    above = [e for e in kept if shown[e][1] < at["top"]]
    assert len(kept) >= 4 and above
    for e in kept:
        assert abs(now[e][0] - shown[e][0]) <= 2, (e, shown[e], now[e])  # nothing moves sideways
    # what was above keeps its place relative to the rest: at most the view scrolls to show the opened box
    rise = {round(now[e][1] - shown[e][1]) for e in above}
    assert max(rise) - min(rise) <= 2, rise
    top = page.evaluate("window.cy.getElementById('g:4').renderedBoundingBox().y1")
    assert 0 <= top <= at["top"], top  # the opened box starts on screen, no lower than the click
    _no_errors(page)


def test_the_graph_stays_put_while_the_page_finishes_loading(live_server: Any, page: Page) -> None:
    """The graph is drawn before plotly.js has loaded: the timeline above it, drawn then, must not push it
    down (a click aimed at a node would land on another)."""
    _record_demo(live_server.store_path, "mlp")
    page.goto(live_server.url)
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    top = page.evaluate("window.cy.container().getBoundingClientRect().top")
    page.wait_for_function("document.querySelector('#timeline-graph .main-svg') !== null")
    assert page.evaluate("window.cy.container().getBoundingClientRect().top") == top


def test_a_module_too_big_to_draw_whole_opens_into_its_calls(live_server: Any, page: Page,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An LSTMCell called in a loop: opened whole, the cell would draw every node of every call (a 100k-node
    step's cell holds 88k), and it stayed folded with a line saying why. It opens into its calls now, the
    first 50 folded (tests/e2e/test_call_folds.py), within the limit on what is drawn; the read-out opens
    too. The limit (10,000 on the page) is lowered here so that a small step shows it."""
    from gradscape.app import view

    wl = lstm_loop(900)
    with gradscape.Tracer(wl.model, run="loop", sink=str(live_server.store_path), tensors="summary") as tr, \
            tr.step(0) as st:
        wl.loss(wl.model, wl.batch()).backward()
    cell = sum(1 for n in st.nodes if n.module == "cell")
    monkeypatch.setattr(view, "MAX_DRAWN", 300)
    assert cell > 300 and len(st.nodes) - cell < 300
    _open(page, live_server.url)

    def click(element: str) -> None:
        at = page.evaluate("""(id) => { const n = window.cy.getElementById(id); window.cy.center(n);
          const r = n.renderedPosition(), box = window.cy.container().getBoundingClientRect();
          return {x: box.left + r.x, y: box.top + r.y}; }""", element)
        page.mouse.click(at["x"], at["y"])
    click("m:cell")
    page.wait_for_function("window.cy.getElementById('c:cell#50').length === 1 && "
                           "window.cy.getElementById('g:cell').length === 1")
    assert "stays folded" not in page.inner_text("#graph-info")
    assert page.evaluate("window.cy.nodes().filter(n => !n.isParent()).length") <= 300
    click("m:head")
    page.wait_for_function("window.cy.getElementById('g:head').length === 1 && "
                           "window.cy.getElementById('g:head').children().length > 0")
    assert page.evaluate("window.cy.getElementById('c:cell#50').length") == 1
    _no_errors(page)
