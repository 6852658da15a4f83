"""The modules of the one import package, `gradscape`, by the mapping the build uses (pyproject.toml's
`[tool.setuptools.package-dir]`): gradscape/ is `gradscape`, tracer/ is `gradscape.tracer`, app/ is
`gradscape.app`. For the tools that read the source rather than import it (tools/typecheck.py,
tools/imports.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {"gradscape": "gradscape", "gradscape.tracer": "tracer", "gradscape.app": "app"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module's name (a package by its own name, not `.__init__`) and its file."""
    out: dict[str, Path] = {}
    for package, folder in MAPPING.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("").parts
            if "__pycache__" in rel or (package == "gradscape" and rel[0] in ("tracer", "app")):
                continue
            out[".".join((package, *(rel[:-1] if rel[-1] == "__init__" else rel)))] = path
    return out
