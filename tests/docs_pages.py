"""What the docs tests read: the repository's paths, the README's and a page's code blocks, and a script of
examples/ run as a module (tests/docs/, tests/e2e/test_docs_figures.py)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def code_blocks(text: str, lang: str | None = None) -> list[str]:
    """The fenced code blocks of a markdown text, in order; only those of `lang` when given."""
    return [body for kind, body in _FENCE.findall(text) if lang is None or kind == lang]


def printed_block(page: Path) -> list[str]:
    """The lines of the first code block after a page's "## What it prints" heading, "..." lines left out."""
    text = page.read_text()
    at = text.index("## What it prints")
    block = code_blocks(text[at:])[0]
    return [line.rstrip() for line in block.splitlines() if line.strip() and line.strip() != "..."]


def example(name: str) -> Any:
    """examples/<name>.py imported as a module (not run as a script: `main()` is the caller's to run)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
