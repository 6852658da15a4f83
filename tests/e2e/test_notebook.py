"""gradscape in a real notebook: cells executed by a real Jupyter kernel (nbclient, ipykernel). A StepTrace
displayed inline is an SVG of its graph; `gradscape.show` gives an iframe whose page (a server in the
kernel, on loopback) answers and shows the step in real Chromium; a shown Tracer's steps reach the open
page as they are traced; a kernel on another machine gets the port-forwarding command, not a blank frame."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from playwright.sync_api import Page

REPO = Path(__file__).resolve().parents[2]

SETUP = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})  # this checkout's gradscape
os.environ["GRADSCAPE_REMOTE"] = "0"  # the browser is on this machine, whatever this machine's environment says
import torch
from torch import nn
import gradscape
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
tr = gradscape.Tracer(model, run="nb")
with tr.step(0) as st:
    model(torch.randn(4, 6)).pow(2).mean().backward()
"""


class Kernel:
    """A notebook whose cells run one at a time in a live kernel: `run(source)` -> the cell's outputs."""

    def __init__(self, client: NotebookClient, nb: Any) -> None:
        self.client, self.nb = client, nb

    def run(self, source: str) -> list[dict[str, Any]]:
        cell = nbformat.v4.new_code_cell(source)
        self.nb.cells.append(cell)
        self.client.execute_cell(cell, len(self.nb.cells) - 1)
        return list(cell.outputs)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    nb = nbformat.v4.new_notebook()
    client = NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=False)
    with client.setup_kernel():
        k = Kernel(client, nb)
        k.run(SETUP)
        yield k


def _html(outputs: list[dict[str, Any]]) -> str:
    return "".join(o.get("data", {}).get("text/html", "") for o in outputs)


def _text(outputs: list[dict[str, Any]]) -> str:
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)


def test_a_step_displays_inline_as_an_svg_of_its_graph(kernel: Kernel) -> None:
    out = kernel.run("st")
    html = _html(out)
    svg = re.search(r"<svg .*?</svg>", html, re.S)
    assert svg is not None, out
    names = json.loads(_text(kernel.run("import json; print(json.dumps([n.id for n in st.nodes]))")))
    assert all(f'data-id="n{i}"' in svg.group(0) for i in names)
    plain = next(o["data"]["text/plain"] for o in out if "data" in o)
    assert plain.startswith("StepTrace(run='nb', step=0") and len(plain) < 120


def test_show_embeds_a_page_that_answers_and_shows_the_step(kernel: Kernel, page: Page) -> None:
    out = kernel.run("view = gradscape.show(st)")
    iframe = re.search(r'<iframe src="([^"]+)"[^>]*></iframe>', _html(out))
    assert iframe is not None, out
    url = iframe.group(1).replace("&amp;", "&")
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?run=nb&step=0", url)
    assert _text(kernel.run("print(view.url)")).strip() == url
    with urllib.request.urlopen(url.split("?")[0] + "api/runs/nb/steps", timeout=10) as resp:
        assert [s["step"] for s in json.loads(resp.read())["steps"]] == [0]
    # the notebook's output, as a page shows it: the iframe loads the page from loopback and draws the step
    page.set_content(_html(out))
    frame = page.frame_locator("iframe")
    frame.locator("#graph").wait_for()
    frame.locator("#backward-player").get_by_text(" of ").first.wait_for()
    handle = page.locator("iframe").element_handle()
    assert handle is not None
    inner = handle.content_frame()
    assert inner is not None
    inner.wait_for_function("window.cy && window.cy.nodes().length > 0")
    assert inner.evaluate("window.cy.nodes('[node]').length") == len(json.loads(_text(kernel.run(
        "print(json.dumps([n.id for n in st.nodes]))"))))
    assert "step 0" in inner.inner_text("#step-select")
    # a second call reuses the server
    again = _text(kernel.run("print(gradscape.show(st, display=False).url)")).strip()
    assert again.split("?")[0] == url.split("?")[0]



def test_a_shown_tracer_streams_its_steps_to_the_open_page(kernel: Kernel, page: Page) -> None:
    url = _text(kernel.run("live = gradscape.Tracer(model, run='live')\n"
                           "print(gradscape.show(live, display=False).url)")).strip()
    assert url.endswith("?run=live")
    page.goto(url)
    page.wait_for_function("window.cy !== undefined")
    kernel.run("with live.step(3):\n    model(torch.randn(4, 6)).sum().backward()")
    page.wait_for_function("(document.querySelector('#step-select') || {innerText: ''}).innerText.includes('step 3')")
    page.wait_for_function("window.cy && window.cy.nodes('[node]').length > 0")
    kernel.run("for i in (4, 5):\n    with live.step(i):\n        model(torch.randn(4, 6)).sum().backward()")
    page.wait_for_function("(document.querySelector('#step-select') || {innerText: ''}).innerText.includes('step 5')")


def test_a_remote_kernel_is_told_how_to_forward_the_port(kernel: Kernel) -> None:
    out = kernel.run("saved = dict(os.environ)\n"
                     "for v in ('GRADSCAPE_REMOTE', 'JUPYTERHUB_API_URL', 'CODESPACES', 'COLAB_RELEASE_TAG', "
                     "'KAGGLE_KERNEL_RUN_TYPE'):\n    os.environ.pop(v, None)\n"
                     "os.environ['SSH_CONNECTION'] = '10.0.0.9 50000 10.0.0.2 22'\n"
                     "remote = gradscape.show(st)\nos.environ.clear(); os.environ.update(saved)")
    html = _html(out)
    assert "<iframe" not in html
    port = int(_text(kernel.run("print(remote.port)")))
    assert f"ssh -N -L {port}:127.0.0.1:{port}" in html and "@10.0.0.2" in html
    assert "SSH_CONNECTION" in html
