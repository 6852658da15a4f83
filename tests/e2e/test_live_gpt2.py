"""Issue 22, the page while a GPT-2 streams: transformers' GPT2LMHeadModel (4 layers, random weights, its long
qualified names) trains in a subprocess (tests/stream_worker.py) and sends every step to a real server; real
headless Chromium shows it. The gradient-flow chart names every layer legibly, the run select's step count
follows the run, the player's node stays in view and in the inspector, and the player's buttons draw in a
browser that has no symbol font."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from serving import get_json, worker

from .conftest import CHROMIUM, CHROMIUM_ARGS, LiveServer, _serve
from .test_live import open_page, shown_step, wait_shown_step_above

RUN = "gpt2-live"


@pytest.fixture(scope="module")
def gpt2_stream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server for the module, with GPT-2's steps streaming into it, one every ~0.4 s."""
    from gradscape.app.server import ServerConfig

    served = _serve(tmp_path_factory.mktemp("gpt2"), ServerConfig(notify_interval=0.05))
    server = next(served)
    proc = worker(server.url, RUN, "--model", "gpt2", "--steps", "3000", "--pause", "0.4")
    try:
        _wait_steps(server.url, 2)
        yield server
    finally:
        proc.kill()
        proc.communicate(timeout=30)
        next(served, None)


def _stored(url: str) -> list[int]:
    try:
        return [s["step"] for s in get_json(f"{url}/api/runs/{RUN}/steps")["steps"]]
    except Exception:  # the run is not there yet
        return []


def _wait_steps(url: str, n: int, timeout: float = 180.0) -> None:
    import time
    deadline = time.monotonic() + timeout
    while len(_stored(url)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {n} steps of {RUN} stored")
        time.sleep(0.1)


def _clean(page: Page) -> None:
    errors = [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]
    assert errors == []


# the labels of the flow chart's layer axis: their text and their boxes on screen
FLOW_TICKS = """() => {
  const gd = document.querySelector('#flow-chart .js-plotly-plot') || document.querySelector('#flow-chart');
  const axis = gd._fullLayout.xaxis.type === 'category' ? 'xtick' : 'ytick';
  const chart = gd.getBoundingClientRect();
  return {chart: [chart.left, chart.top, chart.right, chart.bottom],
          layers: gd.data[0].hovertext,
          ticks: Array.from(gd.querySelectorAll('.' + axis + ' text')).map(t => {
            const r = t.getBoundingClientRect();
            return {text: t.textContent, box: [r.left, r.top, r.right, r.bottom]}; })};
}"""


def test_flow_chart_names_every_layer_without_overlap(gpt2_stream: LiveServer, page: Page) -> None:
    page.set_viewport_size({"width": 1024, "height": 700})  # a small window: the old chart named every other layer
    open_page(page, gpt2_stream.url)
    page.wait_for_function("(document.querySelector('#inspector')?.innerText || '').includes('(node n')")
    page.click("#inspector-tabs >> text=Gradient flow")
    page.wait_for_selector("#flow-chart .xtick text")
    got = page.evaluate(FLOW_TICKS)
    ticks, (left, top, right, bottom) = got["ticks"], got["chart"]
    assert len(ticks) == len(got["layers"]) == 27  # every layer of the 4-layer GPT-2 is named
    hover = "\n".join(got["layers"])
    assert "transformer.h.0.attn.c_attn" in hover  # the full name is on hover
    for t in ticks:  # each label is drawn inside the chart
        x1, y1, x2, y2 = t["box"]
        assert x2 - x1 > 0 and y2 - y1 > 0 and x1 >= left - 1 and x2 <= right + 1 and y1 >= top - 1 \
            and y2 <= bottom + 1, t
    for i, a in enumerate(ticks):
        for b in ticks[i + 1:]:
            ax1, ay1, ax2, ay2 = a["box"]
            bx1, by1, bx2, by2 = b["box"]
            overlap = min(ax2, bx2) - max(ax1, bx1) > 0.5 and min(ay2, by2) - max(ay1, by1) > 0.5
            assert not overlap, (a, b)
    _clean(page)


RUN_COUNT = "(document.querySelector('#run-select') || {innerText: ''}).innerText"


def test_the_run_selects_step_count_follows_the_stream(gpt2_stream: LiveServer, page: Page) -> None:
    open_page(page, gpt2_stream.url)
    step = wait_shown_step_above(page, wait_shown_step_above(page, shown_step(page)))
    stored = len(_stored(gpt2_stream.url))  # at least as many as when the step shown was drawn
    page.wait_for_function("n => { const m = (" + RUN_COUNT + ").match(/\\((\\d+) steps\\)/);"
                           " return !!m && parseInt(m[1]) >= n; }", arg=stored, timeout=20_000)
    label = page.evaluate(RUN_COUNT)
    count = int(re.search(r"\((\d+) steps\)", label).group(1))  # type: ignore[union-attr]
    assert count >= step + 1  # every step is traced, from step 0
    _clean(page)


# the player's node on screen: its element's rendered box against the graph's
PLAYER_IN_VIEW = """() => {
  const cy = window.cy, p = window.gradscape.player.current;
  if (!cy || !p) return false;
  const el = cy.getElementById(p.element);
  if (!el.length) return false;
  const b = el.renderedBoundingBox({includeLabels: false}), W = cy.width(), H = cy.height();
  if (b.w > W || b.h > H) {  // a folded module bigger than the graph's panel: its middle is shown
    const x = (b.x1 + b.x2) / 2, y = (b.y1 + b.y2) / 2;
    return x >= 0 && y >= 0 && x <= W && y <= H;
  }
  return b.x1 >= 0 && b.y1 >= 0 && b.x2 <= W && b.y2 <= H;
}"""


# what the player, its slider and the page's focus held when it did not reach a position (CI's log names it)
PLAYER_STATE = """() => { const P = window.gradscape.player, c = P.current || {};
  return {position: c.position, step: c.step, run: c.run, sigEnd: (c.sig || '').slice(-40), hold: P.hold,
          clicks: P.clicks, nodes: P.order && P.order.nodes.length, focus: document.activeElement &&
          (document.activeElement.id || document.activeElement.tagName),
          info: (document.querySelector('#player-info') || {innerText: ''}).innerText}; }"""


def _player_at(page: Page, position: int) -> None:
    try:
        page.wait_for_function(f"window.gradscape.player.current.position === {position}", timeout=10_000)
    except PlaywrightTimeout:
        raise AssertionError(f"the player never reached {position}: {page.evaluate(PLAYER_STATE)}") from None


# what the inspector's gate (assets/inspector.js) and the selection held when the inspector did not show the
# player's node (CI's log names it)
INSPECTOR_STATE = """() => { const g = window.gradscape.inspect, ins = document.getElementById('inspector');
  const sel = (s) => s ? {step: s.step, node: s.node} : s;
  return {busy_ms: g.busy === null ? null : Math.round(performance.now() - g.busy), pending: sel(g.pending),
          sent: sel(g.sent), rendered: ins && ins.getAttribute('data-rendered'),
          text: ins ? ins.innerText.slice(0, 80) : null, step: window.gradscape.player.current.step,
          url: location.search}; }"""


def _inspector_shows(page: Page, node: int) -> None:
    try:
        page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{node},')",
                               timeout=10_000)
    except PlaywrightTimeout:
        raise AssertionError(f"the inspector never showed n{node}: {page.evaluate(INSPECTOR_STATE)}") from None


def test_the_player_brings_its_node_into_view_and_the_inspector(gpt2_stream: LiveServer, page: Page) -> None:
    open_page(page, gpt2_stream.url)
    page.wait_for_function("window.gradscape.graph && window.gradscape.graph.opened")
    page.click("#graph-info")  # the keys act when no field has the focus
    last = page.evaluate("window.gradscape.player.current.position")
    # zoomed in on the player's node: most of the graph is off screen
    page.evaluate("(() => { const cy = window.cy, el = cy.getElementById(window.gradscape.player.current.element);"
                  " cy.zoom(2.5); cy.center(el); })()")
    moves = [("ArrowLeft", -1)] * 12 + [("ArrowRight", 1)] * 3 + [("ArrowLeft", -1)] * 20
    position = last
    for key, by in moves:
        page.keyboard.press(key)
        position += by
        _player_at(page, position)
        page.wait_for_function(PLAYER_IN_VIEW, timeout=5_000)
        node = page.evaluate("window.gradscape.player.current.node")
        _inspector_shows(page, node)
    # someone panning holds the view: a step of the player while the mouse drags the graph moves nothing
    box = page.locator("#graph").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 + 40, box["y"] + box["height"] / 2 + 30, steps=4)
    held = page.evaluate("[window.cy.pan().x, window.cy.pan().y]")
    page.keyboard.press("ArrowLeft")
    _player_at(page, position - 1)
    page.wait_for_timeout(400)  # a recentring animates over 200 ms: give it the time to show
    assert page.evaluate("[window.cy.pan().x, window.cy.pan().y]") == pytest.approx(held)
    page.mouse.up()
    _clean(page)


FONTS_CONF = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig><dir>/usr/share/fonts/truetype/liberation</dir><cachedir>{cache}</cachedir></fontconfig>
"""

# how many pixels of a PNG (base64) differ from its first pixel (the button's face), and the pixels themselves
INK = """async (b64) => {
  const img = new Image();
  img.src = 'data:image/png;base64,' + b64;
  await img.decode();
  const c = document.createElement('canvas');
  c.width = img.width; c.height = img.height;
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  const face = [d[0], d[1], d[2]];
  let ink = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (Math.abs(d[i] - face[0]) + Math.abs(d[i + 1] - face[1]) + Math.abs(d[i + 2] - face[2]) > 96) ink++;
  }
  return {ink: ink, pixels: Array.from(d)};
}"""


@pytest.fixture(scope="module")
def plain_fonts_browser(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """Chromium that sees only Liberation's fonts (as a Debian install with fonts-liberation only): no font
    of it has ▶ or ❚."""
    folder = tmp_path_factory.mktemp("fonts")
    conf = folder / "fonts.conf"
    conf.write_text(FONTS_CONF.format(cache=folder / "cache"))
    plain = browser.browser_type.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                                        env={**os.environ, "FONTCONFIG_FILE": str(conf)})
    yield plain
    plain.close()


def _inner(page: Page, selector: str) -> str:
    """A screenshot of the inside of `selector` (its border and rounded corners left out), base64."""
    box = page.locator(selector).bounding_box()
    assert box is not None and box["width"] > 8 and box["height"] > 8
    png = page.screenshot(clip={"x": box["x"] + 3, "y": box["y"] + 3, "width": box["width"] - 6,
                                "height": box["height"] - 6})
    return base64.b64encode(png).decode()


def test_the_player_buttons_draw_without_a_symbol_font(gpt2_stream: LiveServer, plain_fonts_browser: Browser,
                                                       tmp_path: Path) -> None:
    ctx = plain_fonts_browser.new_context(viewport={"width": 1500, "height": 950})
    page = ctx.new_page()
    try:
        page.goto(gpt2_stream.url)
        page.wait_for_function("(document.querySelector('#backward-player') || {innerText: ''}).innerText"
                               ".includes(' of ')")
        # what a missing glyph looks like here: a button of the same size showing a private-use character
        page.evaluate("""() => { const b = document.getElementById('player-play'), t = document.createElement('button');
            t.id = 'tofu'; t.className = 'gs-btn'; t.textContent = '\\ue000';
            t.style.width = b.offsetWidth + 'px'; t.style.height = b.offsetHeight + 'px';
            b.parentNode.appendChild(t); }""")
        tofu = page.evaluate(INK, _inner(page, "#tofu"))
        for button in ("#player-prev", "#player-play", "#player-next"):
            drawn = page.evaluate(INK, _inner(page, button))
            assert drawn["ink"] >= 12, button  # something is drawn
            assert drawn["pixels"] != tofu["pixels"], button  # and it is not the missing-glyph box
        page.click("#player-play")  # playing: the pause icon
        page.wait_for_function("document.querySelector('#player-play').title.startsWith('pause')")
        drawn = page.evaluate(INK, _inner(page, "#player-play"))
        assert drawn["ink"] >= 12 and drawn["pixels"] != tofu["pixels"]
        page.click("#player-play")
        page.wait_for_function("document.querySelector('#player-play').title.startsWith('play')")
    finally:
        ctx.close()
