"""The `gradscape` package laid out as it installs, for the tools that read source rather than import it and
cannot follow the build's package mapping: griffe, behind mkdocstrings (docs/reference.md) and
tests/docs/test_docstrings.py. Each module's file is copied to the place its name gives it (tools/modules.py's
mapping) under .cache/docs-package/, a copy made anew each time (no links: the tree has none)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from modules import ROOT, modules

STAGE = ROOT / ".cache" / "docs-package"


def stage(root: Path = ROOT, into: Path = STAGE) -> Path:
    """Copy every module of `gradscape` under `into`, as the package installs; returns `into`."""
    shutil.rmtree(into, ignore_errors=True)
    for name, path in modules(root).items():
        parts = name.split(".")
        target = into.joinpath(*parts, "__init__.py") if path.name == "__init__.py" else \
            into.joinpath(*parts[:-1], parts[-1] + ".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return into


def on_startup(**_: Any) -> None:
    """mkdocs hook (mkdocs.yml `hooks:`): the copy is made before any plugin's `on_config`, where mkdocstrings
    takes its search paths (a path that does not exist yet is dropped there)."""
    stage()
