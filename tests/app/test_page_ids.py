"""The page's element ids live in one place (app/ui/ids.py): the server writes them into the page as
`window.gradscapeIds` before its scripts, and the scripts in assets/ read them from there."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gradscape.app.server import ServerConfig, create_app
from gradscape.app.ui import ids

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
    m = re.search(r"<script>window\.gradscapeIds = (\{.*?\});</script>", html)
    assert m, "no window.gradscapeIds in the page"
    assert json.loads(m.group(1).replace("<\\/", "</")) == _table()
    assert m.start() < html.index("player.js")  # defined before the script that reads it


def test_the_scripts_repeat_no_element_id() -> None:
    for js in sorted(ASSETS.glob("*.js")):
        text = js.read_text()
        assert "window.gradscapeIds" in text, js.name
        for name, value in _table().items():
            for literal in (f'"{value}"', f"'{value}'", f'"#{value}', f"'#{value}", f'"{value}.'):
                assert literal not in text, f"{js.name} repeats {literal} (ids.{name}): use ID.{name}"
