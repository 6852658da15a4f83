"""Type-check the one import package, `gradscape`, from the checkout: `python tools/typecheck.py`.

The package is mapped from three folders (pyproject.toml's `[tool.setuptools.package-dir]`): gradscape/
is `gradscape`, tracer/ is `gradscape.tracer`, app/ is `gradscape.app`. mypy finds modules by walking
folders and knows no such mapping (nor the import hook of an editable install), so `mypy -p gradscape`
would check gradscape/ alone. This gives mypy every file with its module name, from the same mapping
setup.py builds with; the options are pyproject.toml's `[tool.mypy]`, and the errors name the files as
they are in the checkout. Extra arguments go to mypy (e.g. `--no-incremental`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from mypy import build
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {"gradscape": "gradscape", "gradscape.tracer": "tracer", "gradscape.app": "app"}


def sources(root: Path = ROOT) -> Iterator[BuildSource]:
    """Every .py file of the mapping, with the module name it has once installed."""
    for package, folder in MAPPING.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("").parts
            if "__pycache__" in rel or (package == "gradscape" and rel[0] in ("tracer", "app")):
                continue
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            yield BuildSource(str(path.relative_to(root)), ".".join((package, *parts)))


def main(argv: list[str]) -> int:
    _, options = process_options(["--config-file", str(ROOT / "pyproject.toml"), *argv], require_targets=False)
    try:
        result = build.build(list(sources()), options)
    except build.CompileError as e:
        result_errors = e.messages
    else:
        result_errors = result.errors
    for line in result_errors:
        print(line)
    checked = sum(1 for _ in sources())
    if result_errors:
        print(f"Found errors in the {checked} files of gradscape", file=sys.stderr)
        return 1
    print(f"Success: no issues found in {checked} source files of gradscape")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
