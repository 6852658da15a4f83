"""Every `NOTE [..]` that is cited exists where it is cited.

How the code writes them: a note is *defined* where a line starts with it (after the indentation, a comment's
`#`, `//` or `*`, or a docstring's opening quotes) and nothing but a colon follows it on that line; its text
follows (indented below, or after the colon). The tests hold none (a test's docstring may start with the note
it checks). Every other mention *cites* it: the name alone, or "NOTE [X] in path" / "NOTE [X] (path)" with a
file path (relative to the repository or to the citing file's folder) or a dotted module name. A name may
break across lines, as prose does."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("tracer", "app", "gradscape", "tests", "bench", "docs", "assets", "examples", "tools")
SUFFIXES = {".py", ".md", ".h", ".cpp", ".c", ".js", ".css", ".html"}
_NOTE = re.compile(r"NOTE\s+(?:(?:#|//|\*)\s*)?\[([^\]]{1,100})\]")
_BREAK = re.compile(r'"\s*\n?\s*"|\s*\n\s*(?:#|//|\*)?\s*')  # a line break in prose, or two joined string literals
_LEAD = re.compile(r'\s*(?:#|//|\*|/\*|[rbf]?"""|[rbf]?\'\'\')?\s*')
_WHERE = re.compile(r"\s*(?:in|\()\s*`?([\w-]+(?:[./][\w-]+)+)")  # a path or a dotted name: one / or . at least


@dataclass(frozen=True)
class Mention:
    name: str
    file: str  # relative to ROOT
    line: int
    defines: bool
    where: str | None  # the path or module a citation names


def mentions(root: Path, files: list[Path]) -> list[Mention]:
    out = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in _NOTE.finditer(text):
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            after = text[m.end(): len(text) if end < 0 else end]
            defines = (bool(_LEAD.fullmatch(text[start:m.start()])) and after.strip()[:1] in ("", ":")
                       and path.relative_to(root).parts[0] != "tests")
            where = _WHERE.match(_BREAK.sub(" ", text[m.end(): m.end() + 120]))
            out.append(Mention(" ".join(_BREAK.sub(" ", m.group(1)).split()), path.relative_to(root).as_posix(),
                               text.count("\n", 0, m.start()) + 1, defines,
                               None if defines or where is None else where.group(1).rstrip(".")))
    return out


def _candidates(where: str, citing: str) -> set[str]:
    """The files `where` may name, from the citing file."""
    if "/" not in where and not where.endswith((".py", ".h", ".cpp", ".c", ".js", ".md", ".css", ".html")):
        module = where.removeprefix("gradscape.").replace(".", "/")  # a dotted module name
        return {f"{module}.py", f"{module}/__init__.py"}
    return {where, (Path(citing).parent / where).as_posix()}


def unresolved(found: list[Mention]) -> list[str]:
    defined: dict[str, list[str]] = {}
    for m in found:
        if m.defines:
            defined.setdefault(m.name, []).append(m.file)
    bad = [f"NOTE [{n}] is defined twice: {files}" for n, files in defined.items() if len(files) > 1]
    for m in found:
        if m.defines:
            continue
        at = f"{m.file}:{m.line}: NOTE [{m.name}]"
        if m.name not in defined:
            bad.append(f"{at} is defined nowhere")
        elif m.where is not None:
            names = _candidates(m.where, m.file)
            if not any(d in names or d.endswith("/" + m.where) for d in defined[m.name]):
                bad.append(f"{at} is cited in {m.where}, but defined in {defined[m.name][0]}")
    return bad


def _files(root: Path) -> list[Path]:
    found = [p for folder in FOLDERS for p in sorted((root / folder).rglob("*"))
             if p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return [*(p for p in found if p != Path(__file__).resolve()), root / "README.md"]


def test_every_cited_note_is_defined_once_where_it_is_cited() -> None:
    found = mentions(ROOT, _files(ROOT))
    assert sum(m.defines for m in found) > 50 and len(found) > 300  # the notes were found at all
    assert unresolved(found) == []


@pytest.mark.parametrize(("text", "problem"), [
    ("x = 1  # see NOTE [Gone]\n", "NOTE [Gone] is defined nowhere"),
    ("# NOTE [Here] in b.py\n", "NOTE [Here] is cited in b.py, but defined in a.py"),
    ('"""NOTE [Here]\n    text\n"""\n', "NOTE [Here] is defined twice"),
    ("# (NOTE [Split\n# name] in tracer.wire.cols)\n", "NOTE [Split name] is defined nowhere"),
    ("# NOTE [Here] in `tracer.other`\n", "NOTE [Here] is cited in tracer.other, but defined in a.py"),
])
def test_a_citation_that_does_not_resolve_is_named(tmp_path: Path, text: str, problem: str) -> None:
    (tmp_path / "a.py").write_text('"""Module.\n\nNOTE [Here]\n    What it says.\n"""\n# NOTE [Here] in a.py\n')
    (tmp_path / "b.py").write_text(text)
    bad = unresolved(mentions(tmp_path, [tmp_path / "a.py", tmp_path / "b.py"]))
    assert len(bad) == 1 and problem in bad[0], bad


def test_citations_that_resolve() -> None:
    """By path from the repository, by a path from the citing folder, by module name, in parentheses."""
    files = {"tracer/wire/columns.py": '"""x\n\nNOTE [Doc]\n    text\n"""\n',
             "tracer/store.py": "# NOTE [Doc] in `tracer.wire.columns`; NOTE [Doc] in tracer/wire/columns.py\n",
             "tracer/wire/read.py": "# (NOTE [Doc] in columns.py), NOTE [Doc] (columns.py), NOTE\n# [Doc]\n"}
    found = [m for rel, text in files.items() for m in _parse(rel, text)]
    assert unresolved(found) == []
    assert sum(not m.defines for m in found) == 5


def _parse(rel: str, text: str) -> list[Mention]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / rel
        path.parent.mkdir(parents=True)
        path.write_text(text)
        return mentions(Path(tmp), [path])
