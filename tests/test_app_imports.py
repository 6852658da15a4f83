"""What the page's side imports of the tracer: its read side (view, API, schema, store) runs without torch,
and the app reaches no private tracer module or name (the check itself is tested on every form of import)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_view_layer_does_not_import_torch() -> None:
    # the server's read side (view, API, schema, store) runs without torch; gradscape.app.view imports every
    # view module (its __init__), and the run must not find a top-level `app` or `tracer` to import instead
    code = ("import sys, gradscape.app.view, gradscape.app.api, gradscape.app.data, gradscape.tracer.wire, "
            "gradscape.tracer.store; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'app', 'tracer')), 'gradscape.app.view.layout' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[] True", out.stderr


def _package_of(path: Path) -> list[str]:
    """The dotted package a file of the repository is imported in: app/ui/x.py is in gradscape.app.ui."""
    return ["gradscape", *path.relative_to(ROOT).parent.parts]


def _imported(tree: ast.AST, package: list[str]) -> list[str]:
    """Every module or name a module imports, absolute and dotted: `from .x import y` in package p is
    `p.x.y`, `import a.b` is `a.b`; a literal importlib.import_module("a.b") or __import__("a.b") too."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            out += [f"{mod}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                out.append(node.args[0].value)
    return out


# The data model's module: users import its names from `gradscape`, the app from the module itself, since
# `gradscape` is the layer above the app (docs/architecture.md). Its names are public; its module name is not.
_MODEL = "gradscape.tracer._model"


def _private_tracer_use(name: str) -> bool:
    """`name` reaches into the tracer's private modules or names, or imports a top-level `tracer`/`app`
    (there is none once installed: the one import package is gradscape)."""
    parts = name.split(".")
    if parts[0] in ("tracer", "app"):
        return True
    if parts[:2] != ["gradscape", "tracer"]:
        return False
    if name.startswith(_MODEL + ".") and not parts[3].startswith("_"):
        return False
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[2:])


@pytest.mark.parametrize(("source", "where", "private"), [
    ("from gradscape.tracer import _compat", "app/cli.py", True),
    ("from gradscape.tracer import store, _native as n", "app/cli.py", True),
    ("import gradscape.tracer._paths", "app/cli.py", True),
    ("import gradscape.tracer._paths as p", "app/cli.py", True),
    ("from gradscape.tracer._model import StepTrace", "app/view/x.py", False),  # the model's public names
    ("from gradscape.tracer._model import _slots", "app/view/x.py", True),
    ("import gradscape.tracer._model", "app/view/x.py", True),
    ("from gradscape.tracer.store import _private", "app/view/x.py", True),
    ("from ...tracer import _compat", "app/view/x.py", True),
    ("from ..tracer._codec import pack", "app/x.py", True),
    ("from ...tracer._model import _Problem", "app/ui/x.py", True),
    ("from ...tracer._model import Problem", "app/ui/x.py", False),
    ("importlib.import_module('gradscape.tracer._native')", "app/x.py", True),
    ("from tracer import store", "app/x.py", True),
    ("import app.view", "app/x.py", True),
    ("from gradscape.tracer import store, wire", "app/cli.py", False),
    ("from gradscape.tracer.environment import environment", "app/cli.py", False),
    ("from ..tracer.wire import WireStep", "app/x.py", False),
    ("from . import _helpers", "app/view/x.py", False),  # the app's own private modules are its own
    ("from gradscape.app.view import _colours", "app/x.py", False),
    ("import gradscape.tracer", "app/x.py", False),
])
def test_the_private_import_check_sees_every_form(source: str, where: str, private: bool) -> None:
    names = _imported(ast.parse(source), _package_of(ROOT / where))
    assert names and any(_private_tracer_use(n) for n in names) == private, names


def test_app_imports_only_public_tracer_modules() -> None:
    files = sorted((ROOT / "app").rglob("*.py"))
    assert len(files) > 20
    found = [f"{p.relative_to(ROOT)}: {n}" for p in files
             for n in _imported(ast.parse(p.read_text(), str(p)), _package_of(p)) if _private_tracer_use(n)]
    assert not found, found
