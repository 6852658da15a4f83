"""bench/stored_forms.py: one step the Python recorder made, stored both ways; a row per form, the columns' with
its ratio to the maps for each figure, and the file it measures really in that form."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from bench import stored_forms
from gradscape.tracer.blobs import decompress
from gradscape.tracer.wire import unpack


def test_each_form_gets_a_row_and_the_columns_a_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert stored_forms.main(["--lengths", "3", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {ln.split()[1]: ln for ln in lines[2:]}
    assert set(rows) == {"maps", "columns"}
    assert rows["maps"].split()[0] == rows["columns"].split()[0] and int(rows["maps"].split()[0]) > 40  # nodes
    assert len(re.findall(r"\(\d+\.\d+x\)", rows["columns"])) == 4 and "x)" not in rows["maps"]


@pytest.mark.parametrize("form", ["maps", "columns"])
def test_the_file_holds_the_form_it_names(tmp_path: Path, form: str) -> None:
    st = stored_forms._step(3)
    stored_forms.measure(st, form, str(tmp_path), 1)
    with sqlite3.connect(tmp_path / f"{form}.sqlite") as db:
        (blob,) = db.execute("SELECT graph FROM steps").fetchone()
    doc = unpack(decompress(blob))
    assert ("columns" in doc, "nodes" in doc) == (form == "columns", form == "maps")
