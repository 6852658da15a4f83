"""The inspector as a person reads it, in real headless Chromium against a real server: heatmap axes
and hover text in the tensor's own indices, the module tab, the gradient-flow tab, and nothing
drawn over a heading, at 1280×720 and while a run is streaming."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from zoo import build

import gradscape
from gradscape.app.ui import ids
from gradscape.tracer.store import TraceStore

SMALL = {"width": 1280, "height": 720}

# every plot of the visible tab, as page-relative boxes of what plotly drew (its svg layers, which may
# be taller than the graph's own box), and every heading or slot title
_BOXES = """() => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {l: r.left, t: r.top + scrollY, r: r.right, b: r.bottom + scrollY, text: e.innerText}; };
  const plots = Array.from(document.querySelectorAll('#inspector .js-plotly-plot'))
    .filter(gd => gd.offsetParent !== null)
    .map(gd => Array.from(gd.querySelectorAll('svg.main-svg')).map(box));
  const heads = Array.from(document.querySelectorAll('#inspector h2, #inspector h3, #inspector .gs-slot-title'))
    .filter(h => h.offsetParent !== null).map(box);
  return {plots, heads};
}"""


def _record(store: Path, model: nn.Module, batch: torch.Tensor, mode: str, run: str = "r") -> None:
    with gradscape.Tracer(model, run=run, sink=str(store), tensors=mode) as tr, tr.step(0):
        model(batch).pow(2).sum().backward()


def _no_errors(page: Page) -> None:
    errors = [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]
    assert errors == []


def _hover(page: Page, plot: int, x: float, y: float, expect: str) -> str:
    """Move the mouse over data point (x, y) of the `plot`-th visible heatmap; the hover label's text,
    once it holds `expect` (the cell's own label: a label of another cell is a try that missed). The plot's
    place is read again on each try: the inspector may still be re-rendering or restoring its scroll
    position when the first try moves the mouse."""
    # the label of this cell (a label of an earlier hover may still be on screen for a moment)
    label = """want => { const h = document.querySelector('#inspector .hoverlayer .hovertext');
        const t = h ? Array.from(h.querySelectorAll('text.nums tspan.line')).map(t => t.textContent).join('\\n') : '';
        return t.includes(want) ? t : ''; }"""
    for attempt in range(10):
        page.evaluate("i => Array.from(document.querySelectorAll('#inspector .js-plotly-plot'))"
                      ".filter(gd => gd.offsetParent !== null)[i].scrollIntoView({block: 'center'})", plot)
        px, py = page.evaluate("""([i, x, y]) => {
            const gd = Array.from(document.querySelectorAll('#inspector .js-plotly-plot'))
              .filter(gd => gd.offsetParent !== null)[i];
            const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.getBoundingClientRect();
            return [r.left + xa._offset + xa.l2p(x), r.top + ya._offset + ya.l2p(y)];
        }""", [plot, x, y])
        page.mouse.move(1, 1)  # leave, so the move below is a fresh hover
        page.mouse.move(px, py)
        try:
            return str(page.wait_for_function(label, arg=expect, timeout=4000 if attempt < 9 else 30000).json_value())
        except PlaywrightTimeoutError:
            continue
    raise AssertionError(f"no hover label holding {expect!r}")


def _open_node(page: Page, url: str, node: int) -> None:
    """Open a deep link and wait until the inspector shows its node (the page first shows the player's)."""
    page.goto(url)
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{node},')")


def _overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["l"] < b["r"] and b["l"] < a["r"] and a["t"] < b["b"] and b["t"] < a["b"]


def _assert_nothing_over_headings(page: Page) -> None:
    boxes = page.evaluate(_BOXES)
    assert boxes["plots"] and boxes["heads"]
    for plot in boxes["plots"]:
        for layer in plot:
            for head in boxes["heads"]:
                assert not _overlaps(layer, head), f"a plot is drawn over the heading {head['text']!r}"


def _assert_no_horizontal_overflow(page: Page) -> None:
    widths = page.evaluate("""() => {
        const ins = document.querySelector('#inspector');
        return {page: document.documentElement.scrollWidth, view: document.documentElement.clientWidth,
                inner: Math.max(...Array.from(ins.querySelectorAll('*')).map(e => e.getBoundingClientRect().right)),
                right: ins.getBoundingClientRect().right};
    }""")
    assert widths["page"] <= widths["view"], widths  # the page never scrolls sideways
    assert widths["inner"] <= widths["right"] + 1, widths  # nothing in the inspector reaches past its edge


def test_thumbnail_axis_reaches_the_tensors_last_row_and_hover_names_the_rows(live_server: Any,
                                                                              page: Page) -> None:
    torch.manual_seed(0)
    model = nn.Linear(32, 128, bias=False)
    _record(live_server.store_path, model, torch.randn(4, 32), "summary")
    g = model.weight.grad.double().numpy()  # [128×32]; the tracer keeps a 64×32 thumbnail
    with TraceStore(live_server.store_path, readonly=True) as store:
        wire = store.read_graph("r", 0)
    weight = next(n["id"] for n in wire["nodes"] if n["param"] == "weight")
    page.set_viewport_size(SMALL)
    _open_node(page, f"{live_server.url}/?run=r&step=0&node={weight}", weight)
    page.wait_for_selector("#inspector .js-plotly-plot .heatmaplayer")
    lo, hi = sorted(page.evaluate("document.querySelector('#inspector .js-plotly-plot')._fullLayout.yaxis.range"))
    assert lo <= 0 and hi >= 127  # the axis counts the tensor's 128 rows, not the thumbnail's 64 cells
    text = _hover(page, 0, 3, 2.5, "rows 2–3, col 3")  # the cell holding rows 2 and 3 of column 3
    assert "rows 2–3, col 3: mean of 2 elements" in text
    value = float(text.split("\n")[1])
    # a stored thumbnail keeps 8 bits a cell with its range (tracer/wire/compact.py): within (hi - lo) / 504
    # of the block mean, plus the hover text's 4 significant digits
    means = g.reshape(64, 2, 32).mean(axis=1)
    assert abs(value - g[2:4, 3].mean()) <= (means.max() - means.min()) / 504 + 1e-3 * abs(g[2:4, 3].mean())
    text = _hover(page, 0, 0, 127, "rows 126–127, col 0")  # the last row is on the axis
    assert "rows 126–127, col 0" in text
    _no_errors(page)


def test_hovering_a_full_values_cell_gives_its_exact_index_and_value(live_server: Any, page: Page) -> None:
    case = build("mlp")
    with gradscape.Tracer(case.model, run="r", sink=str(live_server.store_path), tensors="full") as tr, tr.step(0):
        case.loss(case.model, case.batch).backward()
    with TraceStore(live_server.store_path, readonly=True) as store:
        st = store.read_step("r", 0)
    addmm = next(n for n in st.nodes if n.name == "AddmmBackward0" and n.module == "fc2")
    mat2 = addmm.grad_inputs[2].values  # [20×30]: grad_outputs[0], then self, mat1, mat2
    page.set_viewport_size(SMALL)
    _open_node(page, f"{live_server.url}/?run=r&step=0&node={addmm.id}", addmm.id)
    page.wait_for_function("document.querySelectorAll('#inspector .js-plotly-plot .heatmaplayer').length >= 4")
    text = _hover(page, 3, 7, 5, "row 5, col 7")
    assert "row 5, col 7" in text
    assert f"{float(mat2[5, 7]):.9g}" in text
    _no_errors(page)


def test_module_tab_and_headings_while_a_run_streams(live_server: Any, page: Page, make_tracer: Any) -> None:
    case = build("mlp")
    tr = make_tracer(case.model, run="live", sink=live_server.url)
    sink = tr.sinks[1]

    def train(i: int) -> None:
        with tr.step(i):
            case.loss(case.model, case.batch).backward()
        deadline = time.monotonic() + 10
        while i not in sink.acked and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)

    train(0)
    with TraceStore(live_server.store_path, readonly=True) as store:
        wire = store.read_graph("live", 0)
    addmm = next(n["id"] for n in wire["nodes"] if n["name"] == "AddmmBackward0" and n["module"] == "fc2")
    page.set_viewport_size(SMALL)
    _open_node(page, f"{live_server.url}/?run=live&step=0&node={addmm}", addmm)
    page.wait_for_function("document.querySelectorAll('#inspector .js-plotly-plot .heatmaplayer').length >= 4")
    page.check(f"#{ids.FOLLOW} input")  # the link named a step, which pinned it: follow the run again
    for i in (1, 2, 3):  # the run goes on; the page follows it (a link naming a step pins it: followed again above)
        train(i)
    page.wait_for_function("location.search.includes('step=3')")
    page.wait_for_function("document.querySelectorAll('#inspector .js-plotly-plot .heatmaplayer').length >= 4")
    assert "Sent on: grad_inputs" in page.inner_text("#inspector")
    _assert_nothing_over_headings(page)
    _assert_no_horizontal_overflow(page)

    page.locator("#inspector-tabs .tab", has_text="Module fc2").click()
    page.wait_for_function("document.querySelectorAll('#inspector .js-plotly-plot .heatmaplayer').length >= 2"
                           " && (document.querySelector('#inspector')?.innerText || '')"
                           ".includes('parameter gradients')")
    train(4)  # still streaming while the tab is read
    text = page.inner_text("#inspector")
    assert "grad_output[0] · ∂L/∂output 0 · [8×30] float32" in text  # slot labels and shapes
    assert "grad_input[0] · ∂L/∂input 0 (positional argument 0) · [8×20] float32" in text
    assert "[30×20] float32" in text and "[30] float32" in text  # the parameters' shapes
    headers = page.eval_on_selector_all("#inspector .gs-params th", "els => els.map(e => e.innerText)")
    assert not {"index", "tensor", "text"} & set(headers)
    cells = page.eval_on_selector_all("#inspector .gs-params td, #inspector .gs-stats td",
                                      "els => els.map(e => e.innerText)")
    numbers = [c for c in cells if re.fullmatch(r"-?\d[\d.]*(e[-+]\d+)?", c)]
    assert numbers
    for cell in numbers:  # 4 significant digits at most
        digits = re.sub(r"e[-+]\d+$", "", cell).lstrip("-").replace(".", "").lstrip("0")
        assert len(digits) <= 4, cell
    _assert_nothing_over_headings(page)
    _assert_no_horizontal_overflow(page)
    tr.close()
    _no_errors(page)


def test_gradient_flow_titles_fit_and_ticks_are_powers_of_ten(live_server: Any, page: Page) -> None:
    case = build("mlp")
    with gradscape.Tracer(case.model, run="r", sink=str(live_server.store_path)) as tr:
        for i in range(3):
            with tr.step(i):
                case.loss(case.model, case.batch).backward()
    with TraceStore(live_server.store_path, readonly=True) as store:
        wire = store.read_graph("r", 2)
    node = next(n["id"] for n in wire["nodes"] if n["module"] == "fc2")
    page.set_viewport_size(SMALL)
    page.goto(f"{live_server.url}/?run=r&step=2&node={node}")
    page.wait_for_selector("#inspector .js-plotly-plot")
    page.locator("#inspector-tabs .tab", has_text="Gradient flow").click()
    page.wait_for_function("document.querySelectorAll('#flow-chart .xtick, #flow-over-steps .ytick').length")
    # the values' axis: x of the flow chart (one row per layer), y of the norm over steps
    # (scrolled to and measured in one evaluation, once the chart is drawn: a render of the inspector still on its
    # way, as under load, replaces the chart's element, and a handle held across two calls finds it detached)
    for graph, axis in (("#flow-chart", "x"), ("#flow-over-steps", "y")):
        got = page.wait_for_function("""([g, a]) => {
            const box = e => { const r = e.getBoundingClientRect();
                               return {l: r.left, t: r.top, r: r.right, b: r.bottom}; };
            const root = document.querySelector(g);
            const svg = root && root.querySelector('svg.main-svg');
            const title = root && root.querySelector('.g-' + a + 'title text');
            const ticks = root ? Array.from(root.querySelectorAll('.' + a + 'tick text')) : [];
            if (!svg || !title || !ticks.length) return null;
            root.scrollIntoView({block: 'nearest'});
            return {title: box(title), svg: box(svg), ticks: ticks.map(e => ({...box(e), text: e.textContent}))};
        }""", arg=[graph, axis]).json_value()
        labels = [t["text"] for t in got["ticks"]]
        assert len(labels) >= 2, labels
        assert all(re.fullmatch(r"1e[-+−]?\d+", t) for t in labels), labels  # powers of ten only
        title, svg = got["title"], got["svg"]
        assert title["l"] >= svg["l"] and title["t"] >= svg["t"] and title["b"] <= svg["b"]  # not cut
        for tick in got["ticks"]:
            assert not _overlaps(title, tick), (graph, tick["text"])
    _assert_no_horizontal_overflow(page)
    _no_errors(page)
