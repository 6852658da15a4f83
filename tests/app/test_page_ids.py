"""The page's element ids live in one place (app/ui/ids.py), and the graph's element-id prefixes in another
(app/view/ids.py): the server writes both into the page's one namespace, `window.gradscape`, before its
scripts, and the scripts in assets/ read them from there and keep their own state there, not in globals
of their own."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gradscape.app.server import ServerConfig, create_app
from gradscape.app.ui import ids
from gradscape.app.view import ids as element_ids

ASSETS = Path(__file__).resolve().parents[2] / "assets"


def _table() -> dict[str, str]:
    table = {k: v for k, v in vars(ids).items() if k.isupper() and isinstance(v, str)}
    assert {"GRAPH", "INSPECTOR", "SELECTED", "PROBLEM_PICK"} <= set(table)
    return table


def test_the_page_carries_its_ids_before_its_scripts(tmp_path: Path) -> None:
    app = create_app(str(tmp_path / "t.sqlite"), ServerConfig())
    try:
        html = app.dash.server.test_client().get("/").get_data(as_text=True)
    finally:
        app.close()
    m = re.search(r"<script>window\.gradscape = (\{.*?\});</script>", html)
    assert m, "no window.gradscape in the page"
    known = json.loads(m.group(1).replace("<\\/", "</"))
    assert known == {"ids": _table(), "elements": element_ids.table()}
    assert m.start() < min(html.index(js.name) for js in ASSETS.glob("*.js"))  # before every script that reads it


def test_the_scripts_repeat_no_element_id() -> None:
    for js in sorted(ASSETS.glob("*.js")):
        text = js.read_text()
        if "ID." in text:  # a script that uses an id reads the table from the namespace
            assert "ID = GS.ids" in text and "GS = window.gradscape" in text, js.name
        assert "window.__gs" not in text and "window.gradscapeIds" not in text, js.name  # one namespace
        for name, value in _table().items():
            for literal in (f'"{value}"', f"'{value}'", f'"#{value}', f"'#{value}", f'"{value}.'):
                assert literal not in text, f"{js.name} repeats {literal} (ids.{name}): use ID.{name}"


def test_the_graph_element_ids_read_back_what_they_make() -> None:
    """app/view/ids.py is the one maker and reader of the graph's element ids (the layout uses it too)."""
    assert element_ids.node_of(element_ids.node_element(12)) == 12
    assert element_ids.module_of(element_ids.module_element("blocks.3")) == "blocks.3"
    assert element_ids.box_of(element_ids.box_element("blocks.3")) == "blocks.3"
    assert element_ids.node_of("m:12") is None and element_ids.module_of("g:blocks.3") is None
    assert element_ids.node_index("n7") == element_ids.node_index("7") == 7
