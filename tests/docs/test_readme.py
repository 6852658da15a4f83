"""The README a newcomer reads in two minutes: short, with the commands it promises, links that resolve,
and every ```python block runs (in order, each in a fresh interpreter, in a temporary folder) and prints
what its comments say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from docs_pages import README, ROOT, code_blocks

MAX_LINES = 160
MAX_LINE_CHARS = 200


def test_readme_is_short_and_has_what_a_newcomer_needs() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES}): move details to docs/"
    long = [k + 1 for k, line in enumerate(lines) if len(line) > MAX_LINE_CHARS]
    assert not long, f"README.md lines over {MAX_LINE_CHARS} characters: {long}"
    for needed in ("pip install gradscape", "make run", "make test", "torch 2.", "docs/cuda.md", "![",
                   "make docs"):
        assert needed in text, needed
    assert len(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)) >= 2  # a screenshot and what the page shows


def test_readme_links_and_pictures_resolve() -> None:
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing
    for picture in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (ROOT / picture).stat().st_size < 300_000, picture


def test_every_python_block_of_the_readme_runs(tmp_path: Path) -> None:
    blocks = code_blocks(README.read_text(), "python")
    assert len(blocks) >= 2
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    outputs = []
    for k, block in enumerate(blocks):
        script = tmp_path / f"readme_block_{k}.py"
        script.write_text(block)
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=240)
        assert done.returncode == 0, f"README block {k} failed:\n{block}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)
    # the quick start traced into its file; the second block prints what its comments say
    assert "AddmmBackward0" in outputs[0] and "step 15" in outputs[0]
    assert "(8, 2) (8, 20)" in outputs[1]
    assert "AddmmBackward0 ['self → 2.bias', 'mat1 → input of 2', 'mat2 → 2.weight (transposed)']" in outputs[1]
