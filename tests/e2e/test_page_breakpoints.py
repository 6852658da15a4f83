"""Breakpoints from the page, in real headless Chromium: a real server (in this process), a real
training subprocess (tests/bp_worker.py); a person selects a node, sets a break on it, sees the
paused backward and its heatmaps, steps one node and continues."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bp_harness import call, paused, reference_params, wait_for  # noqa: E402
from page_geometry import text_boxes  # noqa: E402


class _Srv:
    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str) -> Any:
        return call(self, "GET", path)[1]


def _text(sel: str) -> str:
    return f"(document.querySelector('{sel}') || {{innerText: ''}}).innerText"


def _stored_steps(srv: _Srv, run: str) -> list[int]:
    status, body = call(srv, "GET", f"/api/runs/{run}/steps")
    return [s["step"] for s in body["steps"]] if status == 200 else []


def _gated_run_on_the_page(live_server: Any, page: Page, worker_factory: Any, run: str) -> tuple[_Srv, Any, Any]:
    """A training subprocess for `run` that traced step 0 and waits at its gate before step 1, and the
    page open on it and live; with step 0's node for fc2's addmm."""
    srv = _Srv(live_server.url)
    w = worker_factory("--url", srv.url, "--run", run, "--steps", "3", "--gate", "1")
    w.expect("ready")
    w.go()
    w.expect("gate")  # step 0 is traced; the loop waits before step 1
    # the run is known before its first step is stored (the tracer's hello, its history rows): wait for the step
    wait_for(lambda: _stored_steps(srv, run) == [0], what="step 0 stored")
    graph = srv.api(f"/api/runs/{run}/steps/0")
    fc2 = next(n for n in graph["nodes"] if n["name"] == "AddmmBackward0" and n["module"] == "fc2")
    page.goto(srv.url)
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_function(_text("#connection-status") + ".startsWith('live')")
    return srv, w, fc2


def test_break_step_continue_from_the_page(live_server: Any, page: Page, worker_factory: Any) -> None:
    srv, w, fc2 = _gated_run_on_the_page(live_server, page, worker_factory, "web")
    assert page.locator("#bp-step").is_hidden() and page.locator("#bp-continue").is_hidden()
    # select fc2's addmm on the graph and break on it (by name: the default kind)
    page.evaluate(f"void window.cy.getElementById('n{fc2['id']}').emit('tap')")
    page.wait_for_function(_text("#inspector") + f".includes('(node n{fc2['id']},')")
    page.click("#bp-set")
    page.wait_for_function(_text("#bp-list") + ".includes('node AddmmBackward0')")
    assert srv.api("/api/runs/web/breakpoints")["breakpoints"] == [{"on": "node", "name": "AddmmBackward0"}]

    w.go()  # step 1 starts, and pauses at fc2's addmm
    page.wait_for_function(_text("#bp-where") + ".includes('paused in step 1 at AddmmBackward0')")
    p = paused(srv, "web")
    assert p["node"]["id"] == fc2["id"] and p["node"]["module"] == "fc2"
    k = p["executed"]
    assert f"{k} nodes run" in page.inner_text("#bp-where")
    # the partial backward: one row per node run, the paused one on top; those nodes lit on the graph
    assert page.locator("#bp-nodes tr").count() == k
    assert page.locator("#bp-nodes tr.gs-bp-current").get_attribute("data-node") == str(fc2["id"])
    assert "‖·‖" in page.inner_text("#bp-nodes tr.gs-bp-current")
    # marked as paused, in a style of its own: not a red border, which means NaN/Inf (node.nan, app/ui/page.py)
    current = page.evaluate(f"(() => {{ const n = window.cy.getElementById('n{fc2['id']}');"
                            f" return [n.style('border-color'), n.style('border-style')]; }})()")
    assert current == ["rgb(31,79,209)", "double"], current

    # another site's page (here: the other loopback name, a different origin) cannot resume or clear it
    other = page.context.new_page()
    other.goto(srv.url.replace("127.0.0.1", "localhost") + "/api/runs")
    for path, body in [("/resume", '{"mode": "continue"}'), ("/breakpoints", '{"on": "nonfinite"}')]:
        # a "simple" request: sent without a preflight, with the other page's Origin
        other.evaluate("([u, b]) => fetch(u, {method: 'POST', body: b, mode: 'no-cors', "
                       "headers: {'Content-Type': 'text/plain'}}).then(r => r.type)", [srv.url + "/api/runs/web" + path,
                                                                                     body])
    other.close()
    assert paused(srv, "web", k)
    assert srv.api("/api/runs/web/breakpoints")["breakpoints"] == [{"on": "node", "name": "AddmmBackward0"}]

    # a page opened while the run is paused shows it too (the server's catch-up names the run)
    fresh = page.context.new_page()
    fresh.goto(srv.url)
    fresh.wait_for_function(_text("#bp-where") + f".includes('paused in step 1 at AddmmBackward0 #{fc2['id']}')")
    assert fresh.locator("#bp-continue").is_visible()
    fresh.close()

    page.click("#bp-step")  # one more node
    page.wait_for_function(_text("#bp-where") + f".includes('{k + 1} nodes run')")
    assert paused(srv, "web", k + 1)
    assert page.locator("#bp-nodes tr").count() == k + 1
    assert w.lines.empty()  # the loop did not get past the paused backward

    page.click("#bp-clear")
    page.wait_for_function(_text("#bp-list") + ".includes('no breakpoints')")
    page.click("#bp-continue")
    page.wait_for_function("document.querySelector('#bp-banner').style.display === 'none'")
    w.expect("step 1")
    out, _ = w.result()
    assert out["pauses"] == 2
    assert out["params"] == reference_params()
    errors = [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]
    assert errors == []


def _arrived_at_fc2_in_step_1() -> list[list[float]]:
    """∂L/∂logits of step 1 (after one SGD step), from torch.autograd.grad: what arrives at fc2's addmm."""
    import torch
    from bp_worker import build, train

    model, x, y = build()
    train(model, x, y, 1, None)
    logits = model(x)
    (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, y), logits)
    return g.tolist()  # type: ignore[no-any-return]


def test_paused_heatmaps_on_the_page(live_server: Any, page: Page, worker_factory: Any) -> None:
    """While the training subprocess is paused the page draws the paused node's gradients as heatmaps,
    its slots labelled as the inspector labels them; a click on another row shows that node's; after
    `#bp-step` they are the next paused node's."""
    srv, w, fc2 = _gated_run_on_the_page(live_server, page, worker_factory, "heat")
    assert call(srv, "POST", "/api/runs/heat/breakpoints", {"on": "node", "id": fc2["id"]})[0] == 201
    page.wait_for_function(_text("#bp-list") + f".includes('node #{fc2['id']}')")

    w.go()  # step 1 pauses at fc2's addmm
    page.wait_for_function(_text("#bp-where") + ".includes('paused in step 1 at AddmmBackward0')")
    k = paused(srv, "heat")["executed"]
    shown = f"#bp-heatmaps .gs-bp-node[data-node='{fc2['id']}'][data-order='{k - 1}']"
    page.wait_for_function(f"document.querySelectorAll(\"{shown} .js-plotly-plot .hm\").length === 4")
    text = page.inner_text("#bp-heatmaps")
    for label in ("grad_outputs[0] · ∂L/∂output · [16×3] float32", "grad_inputs[0] · self → fc2.bias · [3] float32",
                  "grad_inputs[1] · mat1 → input of fc2 · [16×8] float32",
                  "grad_inputs[2] · mat2 → fc2.weight (transposed) · [8×3] float32",
                  "thumbnail: every value (to bfloat16's precision)", "the paused node"):
        assert label in text, label
    assert page.locator("#bp-heatmaps .gs-stats").count() == 4
    # the first heatmap is what arrived: torch's own ∂L/∂logits of this step (a picture: to bfloat16's precision,
    # 2^-8 of each value at most)
    z = page.evaluate(f"document.querySelector(\"{shown} .js-plotly-plot\").data[0].z")
    want = _arrived_at_fc2_in_step_1()
    assert len(z) == 16 and all(a == pytest.approx(b, rel=2**-8, abs=1e-8) for r, s in zip(z, want)
                                for a, b in zip(r, s))
    assert page.locator("#bp-nodes tr.gs-bp-picked").get_attribute("data-order") == str(k - 1)
    # the paused nodes' table is read whole across: no text cut at its right (or left) edge, at the
    # narrowest the right column gets
    page.set_viewport_size({"width": 1024, "height": 800})
    cut = [t["text"] for t in text_boxes(page, "#bp-nodes")
           if t["clip"] and (t["box"][2] > t["clip"][2] + 1 or t["box"][0] < t["clip"][0] - 1)]
    assert cut == []

    # a click on the first row (the loss's node) shows its gradients
    page.click("#bp-nodes tr[data-order='0']")
    page.wait_for_function("document.querySelectorAll(\"#bp-heatmaps .gs-bp-node[data-order='0'] .js-plotly-plot\")"
                           ".length >= 2")
    assert "grad_inputs[0] · self → LogSoftmaxBackward0" in page.inner_text("#bp-heatmaps")
    assert page.locator("#bp-nodes tr.gs-bp-picked").get_attribute("data-order") == "0"
    assert w.lines.empty() and paused(srv, "heat", k)  # still paused

    page.click("#bp-step")  # one more node: the heatmaps follow the new paused node
    page.wait_for_function(_text("#bp-where") + f".includes('{k + 1} nodes run')")
    nxt = paused(srv, "heat", k + 1)["node"]
    page.wait_for_function(f"document.querySelectorAll(\"#bp-heatmaps .gs-bp-node[data-node='{nxt['id']}']"
                           f"[data-order='{k}'] .js-plotly-plot\").length >= 1")
    assert f"{nxt['name']} #{nxt['id']}" in page.inner_text("#bp-heatmaps")
    assert page.locator("#bp-nodes tr.gs-bp-picked").get_attribute("data-order") == str(k)

    assert call(srv, "DELETE", "/api/runs/heat/breakpoints")[0] == 200
    page.click("#bp-continue")
    page.wait_for_function("document.querySelector('#bp-banner').style.display === 'none'")
    w.expect("step 1")
    out, _ = w.result()
    assert out["params"] == reference_params()
    errors = [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]
    assert errors == []
