"""The demo's MLP (app/demo.py) recorded into a trace file, and the page opened on it and done loading: shared
by the browser tests of the page's layout and signals."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from playwright.sync_api import Page

import gradscape
from gradscape.app.demo import make


def record_demo(store: Path, steps: int = 2) -> None:
    torch.manual_seed(0)
    net, batch = make("mlp")
    tr = gradscape.Tracer(net, run="demo-mlp", sink=str(store))
    for i in range(steps):
        x, y = batch()  # type: ignore[operator]
        with tr.step(i):
            F.cross_entropy(net(x), y).backward()
    tr.close()


def open_page(page: Page, url: str, inspector: bool = True) -> None:
    page.goto(url)
    page.wait_for_function("window.cy && window.cy.nodes().length > 0 && window.gradscape.graph.opened")
    page.wait_for_function("(document.querySelector('#backward-player') || {innerText: ''}).innerText.includes(' of ')")
    page.wait_for_function("document.querySelector('#timeline-graph .main-svg') !== null")
    if inspector:
        page.wait_for_function("(document.querySelector('#inspector')?.innerText || '').includes('(node n')")
