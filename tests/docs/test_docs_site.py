"""The docs site builds with `mkdocs build --strict` (mkdocs.yml): a broken link, a page missing from the nav's
files, an example a page includes (`--8<--`) that is not there, or an API reference that does not resolve
fails. Then a few built pages are read for what they must hold."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from docs_pages import DOCS, ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _text(site: Path, page: str) -> str:
    html = (site / page / "index.html").read_text()
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def _nav_files(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [f for v in node.values() for f in _nav_files(v)]
    return [f for v in node for f in _nav_files(v)]


def test_every_page_is_in_the_nav_and_built(site: Path) -> None:
    nav = _nav_files(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages  # no page left out of the nav, none listed twice
    for page in pages:
        built = site / ("index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html")
        assert built.is_file(), page


def test_tutorials_include_their_scripts(site: Path) -> None:
    for page, script in [("tutorials/module-hooks", "module_hooks"), ("tutorials/old-backward-hook",
                          "old_backward_hook"), ("tutorials/vjp", "vjp_outer"), ("tutorials/nan", "nan_hunt"),
                         ("tutorials/loss-spike", "loss_spike"), ("tutorials/breakpoints", "live_breakpoints"),
                         ("tutorials/ddp", "ddp_two_ranks")]:
        first_line = (ROOT / "examples" / f"{script}.py").read_text().splitlines()[0].strip('"')
        assert first_line[:40] in _text(site, page), page


def test_api_reference_holds_every_public_name(site: Path) -> None:
    import gradscape

    html = (site / "reference" / "index.html").read_text()
    for name in gradscape.__all__:
        assert f'id="gradscape.{name}"' in html, name
    assert "Records the autograd graph" in html  # a docstring, rendered
