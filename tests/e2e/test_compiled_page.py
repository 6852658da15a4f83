"""A compiled model's steps on the page, in real Chromium on a real server over a real trace file: a traced step
of a compiled model says that it ran eagerly for tracing (an eager model's step says nothing); a
`Tracer.compare_compiled` step shows each parameter's compiled − eager difference in a table, worst first,
whose numbers are the ones computed here from `torch.autograd.grad` of the compiled and the eager model
(never read back from the tracer), and colours the graph by it, the worst parameter's node marked; the
colouring is offered on that step only (NOTE [Difference colouring] in app/view/compiled.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from playwright.sync_api import Page

import gradscape
from gradscape.app.view.compiled import DIFF_LABEL, DIFF_SCALE, DIFF_TITLE, diff_fields, diff_range
from gradscape.app.view.step_fields import fmt_num

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo's own notes on what it compiles

NOTES = "(document.querySelector('#step-notes') || {innerText: ''}).innerText"
GRAPH_KEY = "(window.gradscape && window.gradscape.graph && window.gradscape.graph.key) === {key!r} " \
            "&& window.cy && window.cy.nodes().length > 0"
TABLE_ROWS = """() => [...document.querySelectorAll('#compiled-compare tr[data-param]')].map(tr => ({
    param: tr.getAttribute('data-param'), cells: [...tr.children].map(td => td.innerText),
    exact: [...tr.children].map(td => td.getAttribute('title'))}))"""


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def wait_graph(page: Page, key: str) -> None:
    page.wait_for_function(GRAPH_KEY.format(key=key))


def choose_colour(page: Page, label: str) -> None:
    page.click("#color-by")
    page.get_by_text(label, exact=True).click()


def colour_labels(page: Page) -> list[str]:
    """The colour select's options, as its open menu lists them (closed again with Escape)."""
    page.click("#color-by")
    page.get_by_text("fraction of zeros", exact=True).wait_for(state="visible")  # always one of them
    labels = page.evaluate("[...document.querySelectorAll('[role=option]')].map(o => o.innerText.trim())")
    page.keyboard.press("Escape")
    page.get_by_text("fraction of zeros", exact=True).wait_for(state="hidden")
    assert "fraction of zeros" in labels, labels
    return labels


def test_a_traced_compiled_step_says_it_ran_eagerly_and_an_eager_step_does_not(live_server: Any, page: Page) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    model = mlp()
    cm = torch.compile(model, backend="aot_eager")
    F.cross_entropy(cm(x), y).backward()  # the compile, untraced
    store = str(live_server.store_path)
    with gradscape.Tracer(cm, run="compiled-run", sink=store, monitor=False) as tr, tr.step(0):
        F.cross_entropy(cm(x), y).backward()
    plain = mlp()
    with gradscape.Tracer(plain, run="eager-run", sink=store, monitor=False) as tr, tr.step(0):
        F.cross_entropy(plain(x), y).backward()
    # the newest run (the eager one) is served drawn; the link moves the page to the compiled run's step
    page.goto(f"{live_server.url}/?run=compiled-run&step=0")
    wait_graph(page, "compiled-run/0")
    page.wait_for_function(f"{NOTES}.includes('ran eagerly for tracing')")
    note = page.locator("#step-notes .gs-step-note").first
    assert note.is_visible()
    box, graph = note.bounding_box(), page.locator(".gs-graph-wrap").bounding_box()  # over the graph's corner
    assert box is not None and graph is not None and graph["y"] <= box["y"] < graph["y"] + 40
    assert graph["x"] <= box["x"] < graph["x"] + 40
    assert "compare" not in page.inner_text("#step-notes")
    assert not page.locator("#compiled-compare").is_visible()  # no comparison on this step: no table
    assert DIFF_LABEL not in colour_labels(page)  # nor its colouring
    # the eager run's step, as the page opens on it: no note (the graph drawn is that step's)
    page.goto(live_server.url)
    wait_graph(page, "eager-run/0")
    page.wait_for_function(f"{NOTES} === ''")
    assert page.locator("#step-notes .gs-step-note").count() == 0
    assert not [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]


def expected_rows(names: list[str], compiled: tuple[torch.Tensor, ...],
                  eager: tuple[torch.Tensor, ...]) -> list[dict[str, Any]]:
    """Each parameter's max |c − e|, max |c − e| / max(|e|, float32's tiny), where, and the two values there,
    in float64 with numpy; worst first (ties in the model's order)."""
    rows = []
    for name, c, e in zip(names, compiled, eager, strict=True):
        c64, e64 = c.detach().double().numpy(), e.detach().double().numpy()
        diff = np.abs(c64 - e64)
        rel = diff / np.maximum(np.abs(e64), np.finfo(np.float32).tiny)
        flat = int(diff.argmax())
        rows.append({"param": name, "max_abs": float(diff.max()), "max_rel": float(rel.max()),
                     "at": [int(k) for k in np.unravel_index(flat, diff.shape)],
                     "compiled": float(c64.reshape(-1)[flat]), "eager": float(e64.reshape(-1)[flat])})
    return sorted(rows, key=lambda r: -r["max_abs"])


@pytest.mark.slow
def test_compare_compiled_table_and_colouring_are_torchs_differences(live_server: Any, page: Page) -> None:
    """Inductor (C++ on the CPU) rounds otherwise than eager: the differences are small and not all 0."""
    torch.manual_seed(0)
    model = mlp()
    cm = torch.compile(model)  # inductor
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    names, params = zip(*model.named_parameters())
    compiled = torch.autograd.grad(F.cross_entropy(cm(x), y), params)
    eager = torch.autograd.grad(F.cross_entropy(model(x), y), params)
    want = expected_rows(list(names), compiled, eager)
    assert want[0]["max_abs"] > 0  # else there is no worst parameter to mark
    with gradscape.Tracer(cm, run="cmp", sink=str(live_server.store_path), monitor=False) as tr:
        tr.compare_compiled(0, lambda: F.cross_entropy(cm(x), y).backward())
        with tr.step(1):  # a traced step without the comparison
            F.cross_entropy(cm(x), y).backward()
    page.goto(f"{live_server.url}/?run=cmp&step=0")
    wait_graph(page, "cmp/0")
    page.wait_for_function(f"document.querySelectorAll('#compiled-compare tr[data-param]').length === {len(names)}")
    assert page.locator("#compiled-compare").is_visible()
    rows = page.evaluate(TABLE_ROWS)
    assert [r["param"] for r in rows] == [w["param"] for w in want]
    for r, w in zip(rows, want, strict=True):
        assert r["cells"] == [w["param"], fmt_num(w["max_abs"]), fmt_num(w["max_rel"]),
                              "[" + ", ".join(map(str, w["at"])) + "]", fmt_num(w["compiled"]), fmt_num(w["eager"])]
        shown = [float(v) for v in (r["exact"][1], r["exact"][2], r["exact"][4], r["exact"][5])]
        assert shown == [w["max_abs"], pytest.approx(w["max_rel"], rel=1e-15), w["compiled"], w["eager"]], w
    assert "compiled vs eager" in page.inner_text("#step-notes")
    # the colouring by the difference: the worst parameter's node marked, every parameter on the scale
    choose_colour(page, DIFF_LABEL)
    page.wait_for_function("window.cy.nodes('.worstdiff').length === 1")
    assert page.evaluate("window.cy.nodes('.worstdiff').data('param')") == want[0]["param"]
    fills = page.evaluate("Object.fromEntries(window.cy.nodes('.param').map(n => [n.data('param'), n.data('fill')]))")
    lo, hi = diff_range([w["max_abs"] for w in want])
    assert fills == {w["param"]: diff_fields(w["max_abs"], lo, hi)["color"] for w in want}
    assert fills[want[0]["param"]] == DIFF_SCALE[-1]
    drawn = page.evaluate("window.cy.nodes('.worstdiff').style('background-color')")
    assert drawn.replace(" ", "") == "rgb(" + ",".join(str(int(DIFF_SCALE[-1][k:k + 2], 16)) for k in (1, 3, 5)) + ")"
    legend = page.inner_text(".gs-legend")
    assert DIFF_TITLE in legend and "0: equal" in legend and f"{10 ** lo:.2g}" in legend
    assert math.isclose(10 ** hi, want[0]["max_abs"], rel_tol=1e-9)
    # the step without the comparison: no table, no such colouring offered, and the graph back on ‖grad‖
    page.click("#step-select")
    page.get_by_role("option").filter(has_text="step 1").first.click()
    wait_graph(page, "cmp/1")
    page.wait_for_function("!document.querySelector('#compiled-compare tr')")
    assert not page.locator("#compiled-compare").is_visible()
    page.wait_for_function("document.querySelector('#color-by').innerText.includes('‖grad‖ (log)')")
    page.wait_for_function("window.cy.nodes('.worstdiff').length === 0 && "
                           "document.querySelector('.gs-legend').innerText.includes('‖∂L/∂output‖')")
    assert DIFF_LABEL not in colour_labels(page)
    assert "ran eagerly for tracing" in page.inner_text("#step-notes")
    assert not [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]
