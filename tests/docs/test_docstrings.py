"""Every public name has a docstring, as the API reference (docs/reference.md, mkdocstrings) renders it:
`gradscape.*`, the public methods and properties of its classes, each field of the data model named in its
class's docstring, each option of `Tracer` and `Triggers`, and the framework callbacks and their hooks.
Read statically with griffe (what mkdocstrings reads), so the optional frameworks need not be installed."""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from typing import Any

import griffe
import pytest
from docs_pages import ROOT

import gradscape

CALLBACKS = ("gradscape.integrations.lightning.GradscapeCallback",
             "gradscape.integrations.huggingface.GradscapeCallback")


@pytest.fixture(scope="module")
def package() -> Any:
    sys.path.insert(0, str(ROOT / "tools"))
    from docs_package import stage  # the package as it installs: griffe cannot follow the build's mapping

    loader = griffe.GriffeLoader(search_paths=[str(stage())])
    pkg = loader.load("gradscape", try_relative_path=False)  # not ./gradscape, which lacks tracer/ and app/
    loader.resolve_aliases(implicit=False, external=False)
    return pkg


def _doc(obj: Any) -> str:
    target = obj.final_target if obj.is_alias else obj
    return target.docstring.value if target.docstring else ""


def _missing_members(path: str, cls: Any) -> list[str]:
    """Public methods and properties defined in the class itself, without a docstring."""
    missing = []
    for name, member in cls.members.items():
        if name.startswith("_") or member.is_alias:
            continue
        if member.is_function and not _doc(member):
            missing.append(f"{path}.{name}")
    return missing


def test_every_public_name_has_a_docstring(package: Any) -> None:
    missing = []
    for name in gradscape.__all__:
        obj = package[name]
        target = obj.final_target if obj.is_alias else obj
        if not _doc(obj):
            missing.append(f"gradscape.{name}")
        if target.is_class:
            missing += _missing_members(f"gradscape.{name}", target)
    for path in CALLBACKS:
        cls = package[path.removeprefix("gradscape.")]
        if not _doc(cls):
            missing.append(path)
        missing += _missing_members(path, cls)
    assert not missing, f"public names without a docstring: {missing}"


def test_every_field_of_the_data_model_is_described(package: Any) -> None:
    missing = []
    for name in gradscape.__all__:
        obj = getattr(gradscape, name)
        if not (inspect.isclass(obj) and dataclasses.is_dataclass(obj)):
            continue
        doc = _doc(package[name])
        for f in dataclasses.fields(obj):
            if f"`{f.name}`" not in doc and not re.search(rf"`{f.name}[\[.(=]", doc):
                missing.append(f"{name}.{f.name}")
    assert not missing, f"fields not named in their class's docstring: {missing}"


def test_every_option_of_the_tracer_and_the_callbacks_is_described(package: Any) -> None:
    doc = _doc(package["Tracer"])
    options = [p for p in inspect.signature(gradscape.Tracer).parameters if p != "self"]
    assert len(options) >= 10
    assert [p for p in options if f"`{p}" not in doc] == []
    for path in CALLBACKS:
        cb = _doc(package[path.removeprefix("gradscape.")])
        assert all(f"`{p}`" in cb for p in ("sink", "every", "run")), path
