"""The page's callback graph holds no loop that Dash can only leave when nothing else is in flight.

Dash's renderer holds a requested callback back while any pending callback could still change one of its
inputs or states: the pending callback's outputs, and the outputs of every callback those feed as inputs,
onwards (dash-renderer's `getReadyCallbacks`). A callback with one of its own inputs or states downstream
of its outputs (other than the outputs themselves) is held back by itself: Dash runs it only through its
loop-breaking rule, which applies when the requested callbacks are all that is pending. When a callback
already in flight is dropped (a newer request for it replaced it) in that same pass, nothing requests
again and the whole batch waits for the next event. That is how a click on a node, answered both in the
browser and by the server while the inspector was in flight, left the inspector on the old node until the
next notification (tests/e2e/test_page_breakpoints.py timed out under load). Here the graph is read from
the app as the page receives it, so a loop that comes back is caught without a browser.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from gradscape.app.server import ServerConfig, create_app
from gradscape.app.ui import ids


class Callback(NamedTuple):
    key: str
    outputs: frozenset[str]
    reads: tuple[str, ...]  # inputs, then states, as "id.property"
    inputs: tuple[str, ...]


def _prop(dep: dict[str, Any]) -> str:
    return f"{dep['id']}.{dep['property']}"


def _outputs(key: str) -> frozenset[str]:
    # "id.prop", "..a.p...b.q.." for several; "@hash" marks an allow_duplicate output of the same prop
    parts = key[2:-2].split("...") if key.startswith("..") else [key]
    return frozenset(p.split("@")[0] for p in parts if p)


@pytest.fixture(scope="module")
def callbacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Callback]]:
    app = create_app(str(tmp_path_factory.mktemp("graph") / "t.sqlite"), ServerConfig())
    try:
        dash_app = app[0]
        out = []
        for key, cb in dash_app.callback_map.items():
            ins = tuple(_prop(d) for d in cb["inputs"])
            out.append(Callback(key, frozenset() if cb.get("no_output") else _outputs(key),
                                ins + tuple(_prop(d) for d in cb["state"]), ins))
        yield out
    finally:
        app.close()


def _downstream(cb: Callback, by_input: dict[str, list[Callback]]) -> set[str]:
    """Every prop `cb` may change, at once or through the callbacks its outputs trigger."""
    seen: set[str] = set()
    todo = [cb]
    while todo:
        new = {o for c in todo for o in c.outputs} - seen
        seen |= new
        todo = [c for o in new for c in by_input.get(o, [])]
    return seen


def _held_by_itself(callbacks: list[Callback]) -> dict[str, list[str]]:
    by_input: dict[str, list[Callback]] = {}
    for cb in callbacks:
        for i in cb.inputs:
            by_input.setdefault(i, []).append(cb)
    found = {}
    for cb in callbacks:
        down = _downstream(cb, by_input)
        loop = [r for r in cb.reads if r not in cb.outputs and r in down]
        if loop:
            found[cb.key] = loop
    return found


def test_the_rule_finds_a_loop() -> None:
    # the shape the page had: the link parser's output fed the selection, whose address fed the parser
    link = Callback("deep-link.data", frozenset({"deep-link.data"}), ("url.search", "selected-node.data"),
                    ("url.search",))
    select = Callback("..selected-node.data...url.search..", frozenset({"selected-node.data", "url.search"}),
                      ("deep-link.data",), ("deep-link.data",))
    inspect = Callback("inspector.children", frozenset({"inspector.children"}), ("selected-node.data",),
                       ("selected-node.data",))
    assert _held_by_itself([link, select, inspect]) == {"deep-link.data": ["url.search", "selected-node.data"],
                                                        select.key: ["deep-link.data"]}
    assert _held_by_itself([select, inspect]) == {}


# Callbacks meant to wait for their own downstream: "next problem" reads the run, rank and step shown when it is
# clicked, and its deep link changes them; a click made while a selection is settling should see the settled one
INTENDED = {"next-problem": {"run-select.value", "rank-select.value", "step-select.value"}}


def test_no_callback_is_held_back_by_itself(callbacks: list[Callback]) -> None:
    assert len(callbacks) > 20  # the page's callbacks were read
    held = _held_by_itself(callbacks)
    for key, reads in list(held.items()):
        cb = next(c for c in callbacks if c.key == key)
        allowed = [set(v) for k, v in INTENDED.items() if any(i.startswith(k + ".") for i in cb.inputs)]
        if allowed and set(reads) <= allowed[0]:
            del held[key]
    assert held == {}


def test_the_link_parser_reads_the_address_and_sets_the_link_from_the_browser(callbacks: list[Callback]) -> None:
    # the deep link still reaches the selection (a set_props in assets/links.js), and the address the
    # selection callbacks write is still what the parser reads
    parser = [cb for cb in callbacks if cb.inputs == (f"{ids.URL}.search",)]
    assert len(parser) == 1 and parser[0].outputs == frozenset()
    links_js = (Path(__file__).resolve().parents[2] / "assets" / "links.js").read_text()
    assert "set_props(ID.DEEP_LINK, {data: out})" in links_js
    readers = [cb for cb in callbacks if f"{ids.DEEP_LINK}.data" in cb.inputs]
    writers = [cb for cb in callbacks if f"{ids.URL}.search" in cb.outputs]
    assert readers and writers
