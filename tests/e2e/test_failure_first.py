"""The failing step found first, in real Chromium while a real training process streams to a real server:
a loss spike (step 25) and a NaN loss (step 40, the log of a negative value) are both marked on the
timeline (the NaN at the top edge, labelled, nothing clipped), named with their problem count in the step
list, counted in the run list, and a "next problem" button walks to each and selects its root-cause node
(read from the JSON API, not from the page)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from history_stream import history_rows, streaming_history
from page_geometry import TEXT_BOXES, clipped, overlapping
from playwright.sync_api import Page
from problem_cases import sqrt_of_sqrt
from serving import get_json

import gradscape
from gradscape.app.view.colours import NAN_FILL

RUN = "ff"
SPIKE, NAN = 25, 40
FIGURE = "document.querySelector('#timeline-graph .js-plotly-plot')"


@pytest.fixture
def streaming(live_server: Any) -> Iterator[Any]:
    with streaming_history(live_server.url, RUN, lambda: len(history_rows(live_server.url, RUN)) > NAN + 5,
                           "--steps", "3000", "--every", "1000", "--spike", str(SPIKE), "--nan", str(NAN),
                           "--pause", "0.02"):
        yield live_server


def _open(page: Page, url: str) -> None:
    page.goto(url)
    page.wait_for_function("window.cy && window.cy.nodes().length > 0")
    page.wait_for_function("(document.querySelector('#timeline-info') || {innerText: ''}).innerText"
                           ".includes('2 by a trigger')")


def test_every_triggered_step_is_drawn_and_the_nan_sits_labelled_at_the_top(streaming: Any, page: Page) -> None:
    page.set_viewport_size({"width": 1440, "height": 900})
    _open(page, streaming.url)
    # every triggered step has a mark drawn (a point with a position), in the figure as plotly laid it out;
    # the timeline's text and its figure come from different callbacks and plotly draws after Dash hands it
    # the figure, so this waits until the drawn figure holds both marks
    marks = page.wait_for_function(f"""() => {{ const gd = {FIGURE}; const out = [];
        if (!gd || !gd._fullLayout || !gd.calcdata) return null;
        const top = gd._fullLayout._size.t;
        gd._fullData.forEach((t, k) => {{ const cd = gd.calcdata[k] || [];
          cd.forEach((p, i) => {{ const c = (t.customdata || [])[i];
            if (c && c[1] && p.x !== undefined && isFinite(p.y)) {{
              const ya = gd._fullLayout[(t.yaxis || 'y').replace('y', 'yaxis')];
              out.push({{step: c[0], trigger: c[1], py: ya._offset + ya.c2p(p.y) - top}}); }} }}); }});
        return out.length >= 2 ? out : null; }}""").json_value()
    steps = sorted(m["step"] for m in marks)
    assert steps == [SPIKE, NAN], marks
    nan = next(m for m in marks if m["step"] == NAN)
    assert abs(nan["py"]) <= 2, nan  # on the plot's top edge
    # both labels drawn (the figure is patched as rows stream in: its labels with it)
    texts = page.wait_for_function(f"""() => {{ const boxes = ({TEXT_BOXES})('#timeline');
        const t = boxes.map(b => b.text);
        return t.some(x => x.includes('nonfinite')) && t.some(x => x.includes('loss_spike')) && boxes; }}"""
                                   ).json_value()
    assert clipped(texts) == []
    assert overlapping(texts) == []


def test_lists_name_the_flagged_steps_and_next_problem_walks_to_each(streaming: Any, page: Page) -> None:
    _open(page, streaming.url)
    page.wait_for_function("(document.querySelector('#run-select') || {innerText: ''}).innerText"
                           ".includes('2 flagged')")
    spike = get_json(f"{streaming.url}/api/runs/{RUN}/steps/{SPIKE}")
    nan = get_json(f"{streaming.url}/api/runs/{RUN}/steps/{NAN}")
    assert spike["trigger"] == "loss_spike" and nan["trigger"] == "nonfinite"
    # problems come root cause first (the NaN's: the log that made it); a step without one opens on its loss
    root_cause = nan["problems"][0]["node"] if nan["problems"] else nan["passes"][0]["roots"][0]
    assert root_cause is not None
    assert page.is_checked("#follow-live input")
    page.click("#next-problem")  # from the newest step (40, or a later one): round to the first flagged
    page.wait_for_function("document.querySelector('#step-select').innerText.includes('step 25')")
    assert "loss_spike" in page.inner_text("#step-select")
    assert not page.is_checked("#follow-live input")  # it holds the step it went to
    spike_root = spike["problems"][0]["node"] if spike["problems"] else spike["passes"][0]["roots"][0]
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{spike_root},')")
    page.click("#next-problem")
    page.wait_for_function("document.querySelector('#step-select').innerText.includes('step 40')")
    label = page.inner_text("#step-select")
    assert "nonfinite" in label, label
    if nan["problems"]:
        assert f"{len(nan['problems'])} problem" in label, label
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{root_cause},')")
    page.wait_for_function(f"window.cy.$(':selected').id() === 'n{root_cause}'")
    assert "step 40" in page.inner_text("#step-select")  # the run streams on; the page stays where it was taken
    assert not [e for e in page.console_errors if "wheel sensitivity" not in e]  # type: ignore[attr-defined]


def test_nan_and_inf_look_the_same_everywhere(live_server: Any, page: Page) -> None:
    """A NaN step read from a trace file: its NaN nodes solid red at full strength (as the export draws them),
    the heatmap's NaN cells in a colour outside its scale with a key, the statistics' norm "nan"."""
    tr = gradscape.Tracer(run="n", sink=str(live_server.store_path), tensors="full")
    st = sqrt_of_sqrt(tr, 0)
    tr.close()
    origin = st.problems[0].node
    assert origin is not None
    page.goto(f"{live_server.url}/?run=n&step=0&node={origin}")
    page.wait_for_function("window.cy && window.cy.nodes('.nan').length > 0")
    page.wait_for_function(f"(document.querySelector('#inspector')?.innerText || '').includes('(node n{origin},')")
    # the heatmap: NaN cells drawn in a colour no finite value has, named in a key under the map
    page.wait_for_selector("#inspector .gs-nan-key")
    slot = page.locator("#inspector .gs-slot", has=page.locator(".gs-nan-key")).first
    assert "NaN" in slot.locator(".gs-nan-key").inner_text()
    colours = slot.evaluate("""el => { const gd = el.querySelector('.js-plotly-plot');
        return gd._fullData.map(t => t.colorscale.map(c => c[1])); }""")
    assert len(colours) == 2 and not set(colours[1]) & set(colours[0]), colours
    # the statistics: a norm over values with a NaN among them is NaN, not the finite values' norm
    head = [c.inner_text() for c in slot.locator(".gs-stats tr").nth(0).locator("th").all()]
    row = [c.inner_text() for c in slot.locator(".gs-stats tr").nth(1).locator("td").all()]
    stats = dict(zip(head, row, strict=True))
    assert int(stats["nan"]) > 0 and stats["norm"] == "nan", stats
    for _ in range(len(st.nodes)):  # the player back to the first node: what has not run yet is faded, but
        page.click("#player-prev")  # never a NaN (as the export, which has no player, draws it)
    page.wait_for_function("document.querySelector('#backward-player').innerText.includes('#0 of')")
    looks = page.evaluate("""() => window.cy.nodes('.nan').map(n => ({id: n.id(), fill: n.style('background-color'),
        opacity: n.effectiveOpacity(), bg: n.style('background-opacity')}))""")
    red = "rgb({},{},{})".format(*(int(NAN_FILL[k:k + 2], 16) for k in (1, 3, 5)))
    assert looks and all(x["fill"] == red and x["opacity"] == 1 and x["bg"] == "1" for x in looks), looks
    nan_nodes = {f"n{n.id}" for n in st.nodes if any(t is not None and (t.stats["nan"] or t.stats["inf"])
                                                     for t in (n.grad_inputs or []) + (n.grad_outputs or []))}
    assert {x["id"] for x in looks} == nan_nodes
