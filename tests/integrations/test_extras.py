"""The framework extras as a user gets them: `import gradscape` imports no framework, and (slow) the
built wheel installed into a fresh environment next to a torch installed first, without the extras (the
callbacks then say which extra to install) and with `gradscape[lightning,huggingface]`, which keeps that
torch and pulls no CUDA packages; a Lightning fit traced by the callback runs there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "accelerate")
_SKIP_COPY = shutil.ignore_patterns(".git", ".venv", ".venv-torch-*", ".cache", "site", "build", "dist", "*.egg-info",
                                    "__pycache__", "*.so", "*.pyd",
                                    ".pytest_cache", ".ruff_cache", ".mypy_cache", "runs", "*.sqlite*")


def _run(cmd: list[str], timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    assert res.returncode == 0, f"{cmd}\n{res.stdout}\n{res.stderr}"
    return res


def test_importing_gradscape_imports_no_framework() -> None:
    script = ("import sys, gradscape, gradscape.integrations\n"
              "tr = gradscape.Tracer(None)\n"
              f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])\n"
              "print([m for m in sys.modules if m.startswith('gradscape.integrations.')])\n")
    out = _run([sys.executable, "-c", script], timeout=120, cwd=ROOT).stdout.splitlines()
    assert out == ["[]", "[]"]


def _local_torch_wheel(tmp_path: Path) -> Path | None:
    """The torch wheel pip would install for this torch's version from a local folder of its `find-links`
    (what `make` installs from on these machines), or None."""
    report = tmp_path / "torch-report.json"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps",
                          "--ignore-installed", "-q", "--report", str(report), f"torch=={torch.__version__}"],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        return None
    url = json.loads(report.read_text())["install"][0]["download_info"]["url"]
    return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path)) if url.startswith("file:") else None


@pytest.mark.slow
def test_slow_extras_install_into_a_fresh_environment_without_replacing_torch(tmp_path: Path) -> None:
    wheel_file = _local_torch_wheel(tmp_path)
    if wheel_file is None:
        pytest.skip(f"no local wheel of torch {torch.__version__} in pip's find-links (installing one from the "
                    "index would download hundreds of MB)")
    src, dist = tmp_path / "src", tmp_path / "dist"
    shutil.copytree(ROOT, src, ignore=_SKIP_COPY)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)])
    (wheel,) = dist.glob("gradscape-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    for need in ("gradscape/integrations/__init__.py", "gradscape/integrations/lightning.py",
                 "gradscape/integrations/huggingface.py", "gradscape/integrations/_window.py"):
        assert need in names, f"the wheel lacks {need}"

    env_dir = tmp_path / "env"
    _run([sys.executable, "-m", "venv", str(env_dir)])
    py = str(env_dir / "bin" / "python")
    pin = tmp_path / "constraints.txt"
    pin.write_text(f"torch=={torch.__version__}\n")
    pip = [py, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check", "-c", str(pin)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([*pip, str(wheel_file)], env=env)
    _run([*pip, str(wheel)], env=env)
    for module, extra in (("lightning", "lightning"), ("huggingface", "huggingface")):
        res = subprocess.run([py, "-c", f"import gradscape.integrations.{module}"], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=300)
        assert res.returncode == 1 and f"pip install 'gradscape[{extra}]'" in res.stderr, res.stderr

    _run([*pip, f"{wheel}[lightning,huggingface]"], env=env)
    listed = json.loads(_run([py, "-m", "pip", "list", "--format=json"], env=env).stdout)
    versions = {p["name"].lower(): p["version"] for p in listed}
    assert versions["torch"] == torch.__version__
    assert not [n for n in versions if n.startswith("nvidia")], sorted(versions)
    assert {"lightning", "transformers", "accelerate"} <= set(versions)

    script = Path(__file__).with_name("extras_fit.py")
    out = _run([py, str(script)], env=env, cwd=tmp_path, timeout=600).stdout
    assert out.splitlines()[-1] == "steps [0, 1] passes [2, 2] params net.0.bias,net.0.weight,net.2.bias,net.2.weight"
