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
from gradscape.app.view import collapse
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


def test_the_graph_element_ids_agree() -> None:
    """app/view/collapse.py (the layout's) still makes its own element ids: they are app/view/ids.py's."""
    assert (collapse.MODULE_PREFIX, collapse.BOX_PREFIX) == (element_ids.MODULE_PREFIX, element_ids.BOX_PREFIX)
    for make in ("node_element", "module_element", "box_element"):
        arg = 12 if make == "node_element" else "blocks.3"
        assert getattr(collapse, make)(arg) == getattr(element_ids, make)(arg)
    assert element_ids.node_of(element_ids.node_element(12)) == 12
    assert element_ids.node_of("m:12") is None and element_ids.module_of("m:blocks.3") == "blocks.3"
