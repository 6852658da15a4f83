"""Docstrings that say what is there: every package's `__init__` names each of its modules and folders, and
the trace file's docstring names each of its tables."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent for top in ("gradscape", "tracer", "app") for p in (ROOT / top).rglob("__init__.py"))


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def _named(name: str, doc: str) -> bool:
    return re.search(r"(?<![\w.])" + re.escape(name) + r"(?!\w)", doc) is not None


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_package_names_its_modules(package: Path) -> None:
    doc = _docstring(package / "__init__.py")
    rooms = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    rooms |= {p.name for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert [r for r in sorted(rooms) if not _named(r, doc)] == []


def test_the_trace_files_docstring_names_its_tables() -> None:
    sql = "".join((ROOT / "tracer" / f).read_text(encoding="utf-8")
                  for f in ("store_tables.py", "index_store.py", "history_store.py"))
    tables = set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", sql))
    assert {"steps", "tensors", "step_index", "history"} <= tables
    doc = _docstring(ROOT / "tracer" / "store.py")
    assert [t for t in sorted(tables) if not re.search(rf"^\s*{t}\(", doc, re.M)] == []


def test_a_module_left_out_is_found() -> None:
    assert _named("store_tables", "the tables (store_tables.py)") and not _named("store", "store_tables.py")
    assert not _named("lazy", "lazy_tuples") and not _named("codec", "wire.codec.step_to_wire")
