"""Clear signals, in real Chromium against a real server: axis ticks are numbers in order, no text drawn over
other text (the gradient flow tab's subtitle and its axis title), each heatmap titled once, and the
breakpoint's threshold box shown only for the breakpoint it applies to."""

from __future__ import annotations

from typing import Any

from demo_page import open_page, record_demo
from page_geometry import overlapping, text_boxes
from playwright.sync_api import Page


def test_ticks_are_numbers_in_order_and_text_never_overlaps(live_server: Any, page: Page) -> None:
    record_demo(live_server.store_path, steps=3)
    page.set_viewport_size({"width": 1440, "height": 900})
    open_page(page, live_server.url)
    for axis in ("ytick", "y2tick"):
        ticks = page.evaluate(f"""() => [...document.querySelectorAll('#timeline-graph .{axis} text')]
            .map(t => [t.getBoundingClientRect().top, t.textContent])""")
        assert len(ticks) >= 2, (axis, ticks)
        values = [float(text.replace("−", "-")) for _, text in sorted(ticks, reverse=True)]  # bottom to top
        assert values == sorted(values) and len(set(values)) == len(values), (axis, ticks)
    page.click("#inspector-tabs >> text=Gradient flow")
    page.wait_for_function("document.querySelector('#flow-chart .main-svg') !== null")
    assert overlapping(text_boxes(page, "#inspector")) == []


def test_each_heatmap_is_titled_once(live_server: Any, page: Page) -> None:
    record_demo(live_server.store_path)
    open_page(page, live_server.url)
    slot = page.locator("#inspector .gs-slot").first
    title = slot.locator(".gs-slot-title").inner_text()
    label = title.split(" · ")[1]  # "grad_outputs[0] · ∂L/∂fc1.weight → added to fc1.weight.grad · [20×3] …"
    page.wait_for_function("document.querySelector('#inspector .gs-slot .main-svg') !== null")
    texts = [t["text"] for t in text_boxes(page, "#inspector .gs-slot")]
    assert sum(label in t for t in texts) == 1, texts


def test_the_threshold_box_shows_only_for_a_norm_breakpoint(live_server: Any, page: Page) -> None:
    record_demo(live_server.store_path)
    open_page(page, live_server.url)
    assert not page.is_visible("#bp-above")  # "this node (by name)": no threshold
    page.click("#bp-kind")
    page.get_by_role("option", name="a gradient norm above").click()
    page.wait_for_selector("#bp-above", state="visible")
    page.click("#bp-kind")
    page.get_by_role("option", name="this node's module").click()
    page.wait_for_selector("#bp-above", state="hidden")
