"""The page's find box as a person uses it, for the browser tests.

Dash 4's dropdown is a button; clicking it opens a popover whose search field takes the caret a moment
later (Radix moves the focus once the popover is drawn). A person types once the caret is there; a test
that typed straight after the click lost the keys sent before it (seen once in CI: ".12.lin.weight" was
searched for instead of "37.12.lin.weight", and the 50 hits did not reach stage 37)."""

from __future__ import annotations

from typing import Any

_CARET_IN_SEARCH = """() => { const a = document.activeElement, box = document.querySelector('#search');
  return !!(a && box && a.matches('input.dash-dropdown-search')
            && a.closest('.dash-dropdown-wrapper') === box.closest('.dash-dropdown-wrapper')); }"""


def type_in_find_box(page: Any, text: str) -> None:
    """Click the find box, wait for the caret in its search field, and type `text`."""
    page.click("#search")
    page.wait_for_function(_CARET_IN_SEARCH)
    page.keyboard.type(text)
    typed = page.evaluate("document.activeElement.value")
    assert typed == text, f"the find box holds {typed!r}, not {text!r}"
