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
from pathlib import Path

from mypy import build
from mypy.main import process_options
from mypy.modulefinder import BuildSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
from modules import ROOT, modules  # noqa: E402


def sources(root: Path = ROOT) -> list[BuildSource]:
    """Every .py file of the mapping, with the module name it has once installed."""
    return [BuildSource(str(path.relative_to(root)), name) for name, path in modules(root).items()]


def main(argv: list[str]) -> int:
    _, options = process_options(["--config-file", str(ROOT / "pyproject.toml"), *argv], require_targets=False)
    try:
        result = build.build(sources(), options)
    except build.CompileError as e:
        result_errors = e.messages
    else:
        result_errors = result.errors
    for line in result_errors:
        print(line)
    checked = len(sources())
    if result_errors:
        print(f"Found errors in the {checked} files of gradscape", file=sys.stderr)
        return 1
    print(f"Success: no issues found in {checked} source files of gradscape")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
