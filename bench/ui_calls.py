"""bench/ui.py's clicks inside a module opened into its calls (app/view/call_folds.py): on its first call
(which opens into its ops) and on its "more" node (which draws the next calls); and inside a module opened
into runs of its ops (app/view/op_runs.py), on its first run. Each timed by the page's own clock from the
mouse press to the first frame that shows the answer; and `settle`, the wait for the page to be quiet."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CLICK_PROBE = """
(done) => {
  // the page's own clock, from the mouse press to the first frame after `done` holds
  window.__gsClick = {t0: null, t1: null};
  document.addEventListener('mousedown', () => { window.__gsClick.t0 = performance.now(); },
                            {capture: true, once: true});
  const cond = new Function('return (' + done + ')');
  const frame = () => {
    if (cond()) { requestAnimationFrame(() => { window.__gsClick.t1 = performance.now(); }); return; }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}
"""


def click_element(pg: Any, element: str) -> None:
    """A person's click on the graph's `element`, brought into view first (centred)."""
    at = pg.evaluate("""(id) => { const n = window.cy.getElementById(id);
      window.cy.center(n); const r = n.renderedPosition(), box = window.cy.container().getBoundingClientRect();
      return {x: box.left + r.x, y: box.top + r.y}; }""", element)
    pg.mouse.click(at["x"], at["y"])


def click_timed(pg: Any, element: str, done: str, limit_ms: float) -> float:
    """A person's click on `element` (brought into view first); seconds until the JS condition `done` holds."""
    pg.evaluate(CLICK_PROBE, done)
    click_element(pg, element)
    pg.wait_for_function("window.__gsClick.t1 !== null && window.__gsClick.t0 !== null", timeout=limit_ms)
    t = pg.evaluate("window.__gsClick")
    return float(t["t1"] - t["t0"]) / 1e3


def call_clicks(pg: Any, module: str, settle: Callable[[Any], None], limit_ms: float) -> None:
    """A module opened into its calls (app/view/call_folds.py): a click on its first call (until that call's
    ops are drawn), then on its "more" node (until the next calls are drawn). Prints the seconds; `settle`
    waits for the page's requests to end between clicks."""
    settle(pg)
    shown = pg.evaluate(f"window.cy.nodes().filter(n => n.id().startsWith('c:{module}#') && "
                        "n.data('call')).length")
    took = click_timed(pg, f"c:{module}#1", f"window.cy.getElementById('c:{module}#1').length === 0 && "
                       f"window.cy.getElementById('g:{module}').children().length > {shown}", limit_ms)
    print(f"  a click on {module}'s call 1 (opens its ops): {took:.3f} s")
    settle(pg)
    took = click_timed(pg, f"c:{module}#more", f"window.cy.getElementById('c:{module}#{shown + 1}').length === 1",
                       limit_ms)
    print(f"  a click on {module}'s 'more' ({shown} calls drawn, the next drawn): {took:.3f} s")
    settle(pg)


def run_clicks(pg: Any, module: str, settle: Callable[[Any], None], limit_ms: float) -> None:
    """A module opened into runs of its ops: a click on its first run, until that run's ops are drawn."""
    settle(pg)
    ops = pg.evaluate(f"window.cy.getElementById('o:{module}#0.1').data('count')")
    took = click_timed(pg, f"o:{module}#0.1", f"window.cy.getElementById('o:{module}#0.1').length === 0 && "
                       f"window.cy.getElementById('g:{module}').children().length > {ops}", limit_ms)
    print(f"  a click on {module}'s first run (opens its {ops} ops): {took:.3f} s")
    settle(pg)


def settle(pg: Any) -> None:
    """Wait until no Dash callback is in flight (the page's own requests after it first painted)."""
    pg.wait_for_function("""() => { const e = performance.getEntriesByType('resource');
      window.__gsSeen = window.__gsSeen || [0, performance.now()];
      if (e.length !== window.__gsSeen[0]) { window.__gsSeen = [e.length, performance.now()]; return false; }
      return performance.now() - window.__gsSeen[1] > 500; }""",
                         polling=100)
