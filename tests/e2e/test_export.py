"""The offline HTML file of a step, opened from disk in real headless Chromium with every request that is
not the file itself refused: the graph draws, `#node=<id>` shows that node's heatmaps under their slot
labels, a click on a folded module opens it and a click on its box folds it back, the player walks the
backward order, its buttons drawn icons (assets/icons.css) like the live page's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from earlier_release import step_to_wire
from playwright.sync_api import Page, Route

import gradscape
from gradscape.app.ui.player import PAUSE_CLASS, PAUSE_TITLE, PLAY_CLASS, PLAY_TITLE
from gradscape.app.view import default_collapse

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench/ is not a package of the distribution: import it from the checkout
    sys.path.insert(0, str(REPO))
from bench.workloads import residual_stages  # noqa: E402


def _offline(page: Page) -> list[str]:
    """Refuse every request but file:// ones; returns the list of URLs that were asked for."""
    asked: list[str] = []

    def handle(route: Route) -> None:
        asked.append(route.request.url)
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            route.abort()

    page.route("**/*", handle)
    return asked


def _open(page: Page, path: Path, fragment: str = "") -> list[str]:
    asked = _offline(page)
    page.goto(path.as_uri() + fragment)
    page.wait_for_selector("body[data-ready]")
    assert page.get_attribute("body", "data-error") is None
    return asked


def _traced(model: torch.nn.Module, loss: Any) -> Any:
    """One step traced as a training loop traces it (modules and source lines attributed)."""
    with gradscape.Tracer(model) as tr, tr.step(0) as st:
        loss().backward()
    return st


@pytest.fixture(scope="module")
def folded_step(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """A step big enough to open folded by module (4 stages × 8 residual blocks), and its file."""
    model = residual_stages(stages=4, blocks=8)
    st = _traced(model, lambda: model(torch.randn(2, 4)).pow(2).sum())
    path = st.to_html(tmp_path_factory.mktemp("export") / "step.html")
    return st, path


def test_graph_draws_offline_and_asks_for_nothing_else(page: Page, folded_step: tuple[Any, Path]) -> None:
    st, path = folded_step
    asked = _open(page, path)
    assert asked == [path.as_uri()], f"the file asked for more than itself: {asked}"
    # the first view is folded by module: one element per residual block, as the live page opens it
    folded = page.locator("#graph .gs-node.collapsed")
    assert folded.count() == len(default_collapse(step_to_wire(st))) == 32
    assert page.locator('#graph [data-id="m:0.3"] text').first.text_content() == "0.3"
    box = page.locator("#graph svg").bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 300
    assert page.locator("#graph .gs-edge").count() > 30
    assert page.console_errors == []  # type: ignore[attr-defined]


def test_deep_link_shows_the_nodes_heatmaps(page: Page, folded_step: tuple[Any, Path]) -> None:
    st, path = folded_step
    node = next(n for n in st.nodes if n.name == "AddmmBackward0" and n.module == "2.5.lin")
    _open(page, path, f"#node={node.id}")
    inspector = page.locator("#inspector")
    assert inspector.locator("h2").inner_text() == f"AddmmBackward0 (n{node.id})"
    # the node was inside a folded module: the file opened the view that draws it, and selected it
    assert page.locator(f'#graph [data-id="n{node.id}"].selected').count() == 1
    sent = inspector.locator('.gs-slots[data-kind="grad_inputs"] .gs-slot')
    titles = sent.locator(".gs-slot-title").all_inner_texts()
    assert [t.split(" · ")[0] for t in titles] == node.input_labels
    assert any("2.5.lin.weight" in t for t in titles)
    # every slot with a gradient has a heatmap drawn, in colours: read its pixels back
    canvases = inspector.locator("canvas.gs-heatmap-canvas")
    assert canvases.count() == sum(1 for t in (node.grad_outputs or []) + (node.grad_inputs or []) if t is not None)
    coloured = canvases.first.evaluate("""c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i + 3] === 255) n++;
        return n; }""")
    assert coloured == node.grad_outputs[0].thumb.size  # type: ignore[index, union-attr]
    stats = inspector.locator(".gs-stats").first.inner_text()
    assert "norm" in stats and "zeros%" in stats
    # another link in the same page (hashchange) selects the other node
    other = st.param_node("0.0.lin.bias")
    page.evaluate(f"location.hash = '#node={other.id}'")
    page.wait_for_function(f"document.querySelector('#inspector h2').textContent.includes('(n{other.id})')")


def test_click_opens_a_folded_module_and_its_box_folds_it(page: Page, folded_step: tuple[Any, Path]) -> None:
    st, path = folded_step
    _open(page, path)
    inside = [n.id for n in st.nodes if n.module == "1.2"]  # its own ops (1.2.lin stays folded when it opens)
    assert page.locator(f'#graph [data-id="n{inside[0]}"]').count() == 0
    page.locator('#graph [data-id="m:1.2"]').click()
    page.wait_for_selector(f'#graph [data-id="n{inside[0]}"]')
    assert page.locator('#graph [data-id="m:1.2"]').count() == 0
    assert page.locator('#graph .gs-box[data-module="1.2"]').count() == 1
    drawn = {d for d in page.locator("#graph .gs-node").evaluate_all("els => els.map(e => e.dataset.id)")}
    assert {f"n{i}" for i in inside} <= drawn and "m:1.2.lin" in drawn
    # a node in the opened module is clicked: the inspector shows it and the address names it
    page.locator(f'#graph [data-id="n{inside[0]}"]').click()
    page.wait_for_function(f"location.hash === '#node={inside[0]}'")
    page.locator('#graph .gs-box[data-module="1.2"] rect').click(position={"x": 4, "y": 4})
    page.wait_for_selector('#graph [data-id="m:1.2"]')
    assert page.locator('#graph .gs-box[data-module="1.2"]').count() == 0


def test_problems_and_player(page: Page, tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2), torch.nn.Linear(2, 2))
    model[2].weight.requires_grad_(True)
    x = torch.randn(5, 3)
    with torch.no_grad():
        model[0].bias.fill_(float("nan"))  # a NaN born in the forward: the problem finder names it
    st = _traced(model, lambda: model(x).sum())
    assert st.problems
    path = st.to_html(tmp_path / "nan.html")
    _open(page, path)
    problems = page.locator("#problems")
    assert f"{len(st.problems)} problem" in problems.locator(".gs-problems-count").inner_text()
    first = st.problems[0]
    assert first.message in problems.inner_text()
    if first.node is not None:
        problems.locator(".gs-problem-node").first.click()
        page.wait_for_function(f"location.hash === '#node={first.node}'")
    # a node that sent a NaN on: its map names the NaN cells' colour, outside the scale, as the live page does
    sick = next(n for n in st.nodes if any(g is not None and g.thumb is not None and
                                           np.isnan(np.asarray(g.thumb, dtype=np.float64)).any()
                                           for g in n.grad_inputs))
    page.evaluate(f"location.hash = '#node={sick.id}'")
    page.wait_for_function(
        "[...document.querySelectorAll('#inspector .gs-nan-key')].some(k => k.textContent.includes('NaN'))")
    # the player: back to the start, then one node at a time in the order autograd ran them
    order = st.order
    page.locator("#player-slider").fill("0")
    assert page.locator("#graph .gs-node.pending").count() == len(page.locator("#graph .gs-node").all())
    page.locator("#player-next").click()
    assert page.locator(f'#graph [data-id="n{order[0]}"].current').count() == 1
    assert page.locator("#inspector h2").inner_text().endswith(f"(n{order[0]})")
    page.keyboard.press("ArrowRight")
    assert page.locator(f'#graph [data-id="n{order[1]}"].current').count() == 1
    assert page.locator(f'#graph [data-id="n{order[0]}"].pending').count() == 0
    assert page.console_errors == []  # type: ignore[attr-defined]


def _mask(page: Page, button: str) -> str:
    """The mask image a button's icon (its ::before) is drawn with."""
    return str(page.locator(button).evaluate("""b => {
        const s = getComputedStyle(b, '::before');
        return s.maskImage || s.webkitMaskImage; }"""))


def test_player_buttons_are_icons_and_play_switches_to_pause(page: Page, folded_step: tuple[Any, Path]) -> None:
    """The player's buttons are the live page's drawn icons (app/ui/page.py, app/ui/player.py), no glyph
    text; the file carries their masks (data: URLs, no request); play turns into pause and back."""
    _, path = folded_step
    asked = _open(page, path)
    play = page.locator("#player-play")
    for button, icon in (("#player-prev", "gs-icon-prev"), ("#player-next", "gs-icon-next")):
        assert page.locator(button).get_attribute("class") == f"gs-btn gs-icon {icon}"
    assert (play.get_attribute("class"), play.get_attribute("title")) == (PLAY_CLASS, PLAY_TITLE)
    masks = {}
    for button in ("#player-prev", "#player-play", "#player-next"):
        assert page.locator(button).text_content() == ""
        masks[button] = _mask(page, button)
        assert masks[button].startswith('url("data:image/svg+xml'), (button, masks[button])
    assert len(set(masks.values())) == 3
    play.click()
    assert (play.get_attribute("class"), play.get_attribute("title")) == (PAUSE_CLASS, PAUSE_TITLE)
    assert play.text_content() == ""
    assert _mask(page, "#player-play").startswith('url("data:image/svg+xml')
    assert _mask(page, "#player-play") not in masks.values()
    play.click()
    assert (play.get_attribute("class"), play.get_attribute("title")) == (PLAY_CLASS, PLAY_TITLE)
    assert asked == [path.as_uri()], f"the file asked for more than itself: {asked}"
    assert page.console_errors == []  # type: ignore[attr-defined]
