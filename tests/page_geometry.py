"""What a person sees, measured in the page: the boxes of the text drawn in a part of the page (HTML text and
SVG text, plotly's included), which of them overlap, and which are cut off by a box that clips them."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Page

# every visible piece of text under `root`: its box, and the box of the nearest ancestor that clips it
# (overflow other than visible, an SVG's own box); text nodes of HTML elements are measured with a Range
TEXT_BOXES = """(root) => {
  const out = [];
  const scope = typeof root === 'string' ? document.querySelector(root) : document.body;
  if (!scope) return out;
  const clipOf = (el) => {
    for (let p = el.parentElement; p; p = p.parentElement) {
      if (p.tagName === 'svg' && p.classList.contains('main-svg')) return p.getBoundingClientRect();
      if (p.tagName === 'svg') continue;
      const s = getComputedStyle(p);
      if (s.overflowX !== 'visible' || s.overflowY !== 'visible') return p.getBoundingClientRect();
    }
    return null;
  };
  // (checkVisibility: also the content of a closed <details>, which keeps its layout boxes)
  const visible = (el) => el.checkVisibility({opacityProperty: true, visibilityProperty: true});
  const walker = document.createTreeWalker(scope, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    const text = t.textContent.replace(/\u200b/g, '').trim();
    const el = t.parentElement;
    if (!text || !el || !visible(el) || el.closest('.dash-dropdown-options, [role=listbox], .modebar')) continue;
    let r;
    if (el.closest('svg')) r = el.getBoundingClientRect();  // a <text> or <tspan>: the text's own box
    else { const range = document.createRange(); range.selectNodeContents(t); r = range.getBoundingClientRect(); }
    if (r.width < 1 || r.height < 1) continue;
    const c = clipOf(el);
    out.push({text: text.slice(0, 60), box: [r.left, r.top, r.right, r.bottom],
              clip: c ? [c.left, c.top, c.right, c.bottom] : null, svg: !!el.closest('svg')});
  }
  return out;
}"""


def text_boxes(page: Page, root: str | None = None) -> list[dict[str, Any]]:
    return list(page.evaluate(TEXT_BOXES, root))


def _overlap(a: list[float], b: list[float], slack: float) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > slack and min(a[3], b[3]) - max(a[1], b[1]) > slack


def overlapping(boxes: list[dict[str, Any]], slack: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of different text boxes that overlap by more than `slack` px each way."""
    out = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if a["box"] != b["box"] and _overlap(a["box"], b["box"], slack):
                out.append((a["text"], b["text"]))
    return out


def clipped(boxes: list[dict[str, Any]], slack: float = 1.0) -> list[str]:
    """Texts whose box reaches past the box that clips them."""
    out = []
    for t in boxes:
        c, b = t["clip"], t["box"]
        if c and (b[0] < c[0] - slack or b[1] < c[1] - slack or b[2] > c[2] + slack or b[3] > c[3] + slack):
            out.append(t["text"])
    return out
