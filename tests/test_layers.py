"""Imports run one way (docs/architecture.md): no import of a higher layer by a lower one, no import cycle
through two packages, and no known exception left (tools/imports.py's ALLOWED empty). The
check reads the source (tools/imports.py), so it sees lazy imports as well as those at the top."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import imports as layering  # noqa: E402


def test_no_import_runs_up() -> None:
    bad = [f"{i.importer} imports {i.imported} (line {i.line})" for i in layering.upward(layering.imports())]
    assert bad == [], "imports against the layers of docs/architecture.md:\n" + "\n".join(bad)


def test_no_import_cycle_spans_packages() -> None:
    assert layering.cycles(layering.imports()) == []


def test_every_module_is_in_a_layer_and_every_exception_is_still_needed() -> None:
    found = layering.imports()
    for u in {layering.unit(m) for m in layering.modules()}:
        layering.layer_of(u)  # raises for a package no layer names
    pairs = {i.units() for i in found}
    assert [p for p in layering.ALLOWED if p not in pairs] == []  # fixed: take it off the list
    assert layering.ALLOWED == {}  # no exception to the layers is left: keep it so


def test_the_architecture_page_draws_these_layers() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert layering.render() in page


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in {"gradscape/__init__.py": "", "tracer/__init__.py": "", "app/__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_check_finds_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    """On a small tree: a lazy absolute import and a relative one are found (a type-checking one is not);
    the model importing the wire form runs up; the two importing each other is a cycle."""
    root = _tree(tmp_path, {
        "tracer/_model.py": "def f():\n    from gradscape.tracer.wire import codec\n",
        "tracer/wire/__init__.py": "",
        "tracer/wire/codec.py": "from .. import _model\n",
        "tracer/report.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from gradscape.app.view import grid\n"),
        "app/view/__init__.py": "",
        "app/view/grid.py": "import gradscape.tracer.report\n",
    })
    found = layering.imports(root)
    assert {(i.importer, i.imported, i.line) for i in found} == {
        ("gradscape.tracer._model", "gradscape.tracer.wire.codec", 2),
        ("gradscape.tracer.wire.codec", "gradscape.tracer._model", 1),
        ("gradscape.app.view.grid", "gradscape.tracer.report", 1),
    }
    assert [(i.importer, i.imported) for i in layering.upward(found)] == [
        ("gradscape.tracer._model", "gradscape.tracer.wire.codec")]
    assert layering.cycles(found) == [["gradscape.tracer._model", "gradscape.tracer.wire"]]


def test_a_package_in_no_layer_is_named() -> None:
    with pytest.raises(KeyError, match="gradscape.tracer.newroom is in no layer"):
        layering.layer_of("gradscape.tracer.newroom")
