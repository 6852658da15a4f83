"""The docs' pictures of the page (docs/page.md, the README), taken from real traced steps in real headless
Chromium against a real server. Each test checks what its picture must show; with GRADSCAPE_DOCS_FIGURES set
to a folder (`docs/images` to refresh the committed ones) the PNGs are written there, else to a temporary
folder. docs/screenshot.png, the README's first picture, is tests/e2e/test_ui.py's (GRADSCAPE_SCREENSHOT)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from docs_pages import example
from playwright.sync_api import Page

import gradscape
from gradscape.tracer.store import TraceStore

MAX_BYTES = 300_000  # a committed picture stays small


def _out(tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ.get("GRADSCAPE_DOCS_FIGURES", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def _select(page: Page, url: str, run: str, step: int, node: int) -> None:
    page.goto(f"{url}/?run={run}&step={step}&node={node}")
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_function(f"window.cy.$(':selected').id() === 'n{node}'")
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{node},')")


def test_inspector_figure_shows_the_slots_of_a_linear(live_server: Any, page: Page, tmp_path: Path) -> None:
    tutorial = example("module_hooks")
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    net = tutorial.Net()
    x, y = torch.randn(2, 1, 8, 8), torch.tensor([0, 2])
    tr = gradscape.Tracer(net, run="cnn", sink=str(live_server.store_path), tensors="full")
    with tr, tr.step(0) as st:
        F.cross_entropy(net(x), y).backward()
    assert st is not None
    node = next(n for n in st.nodes if n.module == "fc2" and n.name == "AddmmBackward0")
    page.set_viewport_size({"width": 1500, "height": 2000})  # tall enough for every slot's heatmap
    _select(page, live_server.url, "cnn", 0, node.id)
    page.wait_for_function("document.querySelectorAll('#inspector .js-plotly-plot').length >= 4")
    text = page.inner_text("#inspector")
    for label in node.input_labels:  # each slot titled by its label, as the tutorial says
        assert label in text, (label, text[:500])
    out = _out(tmp_path, "page-inspector.png")
    page.locator("#inspector").screenshot(path=str(out))
    png = out.read_bytes()
    width, height = _png_size(png)
    assert width > 200 and height > 200 and len(png) < MAX_BYTES


def test_problems_figure_shows_where_the_nan_was_born(live_server: Any, page: Page, tmp_path: Path) -> None:
    tutorial = example("nan_hunt")
    import torch

    torch.manual_seed(0)
    net = tutorial.Net()
    with gradscape.Tracer(net, run="nan", sink=str(live_server.store_path)) as tr, tr.step(0):
        tutorial.loss_of(net, torch.randn(8, 4)).backward()
    with TraceStore(live_server.store_path, readonly=True) as store:
        st = store.read_step("nan", 0)
    born = st.problems[0]
    assert born.kind == "nonfinite_forward" and born.node is not None
    _select(page, live_server.url, "nan", 0, born.node)
    count = f"{len(st.problems)} problems"
    page.wait_for_function(f"(document.querySelector('#problems')?.innerText || '').includes('{count}')")
    assert born.message in page.inner_text("#problems")
    assert "SqrtBackward0" in page.inner_text("#inspector")
    out = _out(tmp_path, "page-problems.png")
    page.screenshot(path=str(out))
    png = out.read_bytes()
    assert _png_size(png) == (1500, 950) and len(png) < MAX_BYTES
