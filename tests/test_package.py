"""gradscape as a package: what a wheel holds, the torch gate, where
files go. The slow test builds an sdist and a wheel from it, installs the wheel into a fresh
environment and runs it with no C compiler on PATH."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import pytest
import torch

import gradscape
from gradscape.tracer import _compat
from gradscape.tracer.sinks import paths as _paths
from gradscape.tracer.sinks.socket import SocketSink

sys.path.insert(0, str(Path(__file__).parent))
from serving import ROOT, free_port, wait_http  # noqa: E402

_SKIP_COPY = shutil.ignore_patterns(".git", ".venv", ".venv-torch-*", ".cache", "site", "build", "dist", "*.egg-info",
                                    "__pycache__", "*.so", "*.pyd",
                                    ".pytest_cache", ".ruff_cache", ".mypy_cache", "runs", "*.sqlite*")


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]
    assert res.returncode == 0, f"{cmd}\n{res.stdout}\n{res.stderr}"
    return res


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read()


def _install(tmp_path: Path, wheel: Path) -> tuple[Path, Path, dict[str, str]]:
    """A fresh environment with `wheel` installed: (its folder, its site-packages, an environment
    for running it with no C compiler on PATH). The dependencies (torch, dash...) come from this
    interpreter's site-packages, after the wheel's (a .pth line: their own .pth files, an editable
    gradscape among them, are not read)."""
    env_dir = tmp_path / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    py = env_dir / "bin" / "python"
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (purelib / "gradscape-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile", str(wheel)])
    bare = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CC", "CXX", "LD_LIBRARY_PATH")}
    bare.update(PATH=str(env_dir / "bin"), GRADSCAPE_DATA_DIR=str(tmp_path / "data"))
    for cc in ("cc", "gcc", "clang"):
        assert shutil.which(cc, path=bare["PATH"]) is None
    return env_dir, purelib, bare


def _check_one_import_name(wheel: Path, kernel: bool) -> set[str]:
    """The wheel adds one import package, `gradscape` (its file list and top_level.txt say so), with the page's
    assets, the tracer's data and, when `kernel`, the summary kernel; its files."""
    with zipfile.ZipFile(wheel) as zf:
        files = set(zf.namelist())
        info = "gradscape-0.1.0.dist-info/"
        top_level = zf.read(info + "top_level.txt").decode().split()
        entry_points = zf.read(info + "entry_points.txt").decode()
    assert {f.split("/")[0] for f in files} == {"gradscape", "gradscape-0.1.0.dist-info"}, sorted(files)
    assert top_level == ["gradscape"]
    assert "gradscape = gradscape.app.cli:main" in entry_points
    assets = {f"gradscape/assets/{p.name}" for p in (ROOT / "assets").iterdir() if p.suffix in (".js", ".css")}
    assert assets and {f for f in files if f.startswith("gradscape/assets/")} == assets
    for folder, pattern in (("tracer/data", "*.json"), ("tracer/record/csrc", "*"), ("app/export/page", "*")):
        carried = {f"gradscape/{folder}/{p.name}" for p in (ROOT / folder).glob(pattern)}
        assert carried and carried <= files, (folder, sorted(carried - files))
    modules = {f"gradscape/{p.relative_to(ROOT).as_posix()}" for top in ("tracer", "app")
               for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts}
    assert modules <= files, sorted(modules - files)  # every module of tracer/ and app/, under gradscape/
    for need in ("gradscape/__init__.py", "gradscape/__main__.py", "gradscape/py.typed",
                 "gradscape/integrations/lightning.py"):
        assert need in files, f"the wheel lacks {need}"
    built = {f for f in files if f.startswith("gradscape/tracer/summary/_fastsum")}
    assert not any(f.endswith((".c", ".h")) for f in built)  # the kernel's source is in the sdist only
    assert bool(built) == kernel, sorted(built)
    return files


def _check_installed(env_dir: Path, bare: dict[str, str], cwd: Path) -> None:
    """In the fresh environment: `import gradscape` is the installed package with its public API, `python -m
    gradscape` and the `gradscape` script run, there is no `tracer` or `app` to import, and the server's
    read side (the view layer, the API, the schema, the store) imports no torch."""
    py = str(env_dir / "bin" / "python")
    purelib = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=bare).stdout.strip()
    code = "import gradscape as g; print(g.__file__, g.Tracer.__module__.split('.')[0], g.Tracer.__name__)"
    out = _run([py, "-c", code], env=bare, cwd=cwd).stdout.split()
    assert out == [str(Path(purelib) / "gradscape" / "__init__.py"), "gradscape", "Tracer"], out
    for cmd in ([py, "-m", "gradscape", "--help"], [str(env_dir / "bin" / "gradscape"), "--help"]):
        usage = _run(cmd, env=bare, cwd=cwd).stdout
        assert "serve" in usage and "doctor" in usage, usage
    for name in ("tracer", "app"):
        res = subprocess.run([py, "-c", f"import {name}"], capture_output=True, text=True, env=bare, cwd=cwd,
                             timeout=120)
        assert res.returncode == 1 and f"No module named '{name}'" in res.stderr, (name, res.stderr)
    code = ("import sys, gradscape.app.view, gradscape.app.api, gradscape.tracer.wire, gradscape.tracer.store; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    assert _run([py, "-c", code], env=bare, cwd=cwd).stdout.strip() == "[]"


def _copy_tree(tmp_path: Path) -> Path:
    """The working tree as a clone has it: gradscape/, tracer/, app/ and assets/ side by side, no links."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_SKIP_COPY, symlinks=True)
    assert not [p for p in src.rglob("*") if p.is_symlink()]
    return src


def test_no_link_is_tracked() -> None:
    """The package is mapped by the build (pyproject.toml's package-dir), not by symbolic links: a
    checkout on a file system without links works."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = _run(["git", "ls-files", "-s"], cwd=ROOT).stdout.splitlines()
    assert listed and [line for line in listed if line.startswith("120000 ")] == []


def test_every_module_has_one_path() -> None:
    """In this (editable) install `gradscape.tracer` is tracer/ and `gradscape.app` is app/, and a module's
    file is where the checkout has it (no second path through gradscape/)."""
    import gradscape.app.cli
    import gradscape.tracer.store

    assert Path(gradscape.__file__) == ROOT / "gradscape" / "__init__.py"
    assert Path(gradscape.tracer.store.__file__) == ROOT / "tracer" / "store.py"
    assert Path(gradscape.app.cli.__file__) == ROOT / "app" / "cli.py"
    assert not (ROOT / "gradscape" / "tracer").exists() and not (ROOT / "gradscape" / "app").exists()


@pytest.mark.slow
def test_slow_editable_install_maps_the_checkout(tmp_path: Path) -> None:
    """`pip install -e` of a clone into a fresh environment: from any folder, `gradscape.tracer` and
    `gradscape.app` are the clone's tracer/ and app/ (setuptools' editable finder, from the package-dir
    mapping), the page's assets are found, and `python -m gradscape` runs; an edit to tracer/ is seen."""
    src = _copy_tree(tmp_path)
    env_dir = tmp_path / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    py = str(env_dir / "bin" / "python")
    purelib = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (purelib / "gradscape-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {**os.environ, "CC": "/bin/false"}  # the kernel is not what this test is about: no compile
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(src)],
         env=env, cwd=tmp_path)
    (src / "tracer" / "edited.py").write_text("WHERE = 'the clone'\n")
    code = ("import gradscape, gradscape.tracer.store as s, gradscape.app.cli as c, gradscape.tracer.edited as e\n"
            "from gradscape.app.server import factory\n"
            "print(gradscape.__file__, s.__file__, c.__file__, e.WHERE == 'the clone', factory._assets_folder())\n")
    out = _run([py, "-c", code], cwd=tmp_path).stdout.split()
    want = [src / "gradscape" / "__init__.py", src / "tracer" / "store.py", src / "app" / "cli.py"]
    assert out == [*map(str, want), "True", str(src / "assets")], out
    assert "serve" in _run([py, "-m", "gradscape", "--help"], cwd=tmp_path).stdout


@pytest.mark.slow
def test_slow_wheel_built_where_compiling_fails_installs_and_warns_once(tmp_path: Path) -> None:
    """The kernel is optional: a build from the tree whose compiler fails still gives a wheel of the one
    import package, with the assets and without the kernel; installed, it traces with torch reductions
    after one warning saying why."""
    src = _copy_tree(tmp_path)
    dist = tmp_path / "dist"
    env = {**os.environ, "CC": "/bin/false"}  # every compile fails
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
         env=env, cwd=tmp_path)
    (wheel,) = dist.glob("gradscape-*.whl")
    _check_one_import_name(wheel, kernel=False)
    env_dir, _, bare = _install(tmp_path, wheel)
    run_dir = tmp_path / "cwd"
    run_dir.mkdir()
    _check_installed(env_dir, bare, run_dir)
    doctor = _run([str(env_dir / "bin" / "gradscape"), "doctor"], env=bare, cwd=run_dir).stdout
    assert "summariser: torch (the summary kernel was not built when gradscape was installed" in doctor, doctor
    script = ("import warnings, torch, gradscape\n"
              "with warnings.catch_warnings(record=True) as seen:\n"
              "    warnings.simplefilter('always')\n"
              "    for i in range(2):\n"
              "        st = gradscape.trace((torch.nn.Parameter(torch.ones(4, 3)) * 2).sum())\n"
              "print(len(st.nodes), [str(w.message) for w in seen])\n")
    out = _run([str(env_dir / "bin" / "python"), "-c", script], env=bare, cwd=run_dir).stdout
    assert out.startswith("3 [") and out.count("summary kernel was not built") == 1, out


@pytest.mark.slow
def test_slow_wheel_installed_without_compiler_serves_page_and_native_summariser(tmp_path: Path) -> None:
    """sdist → wheel (the way pip builds from PyPI) → a fresh environment → no compiler on PATH: the wheel
    adds only `gradscape`; `gradscape doctor` reports the native summariser from the installed package, and
    `gradscape serve` from that install serves the page with its clientside script and CSS."""
    src = _copy_tree(tmp_path)
    dist = tmp_path / "dist"
    _run([sys.executable, "-c", f"import setuptools.build_meta as b; b.build_sdist({str(dist)!r})"], cwd=src)
    (sdist,) = dist.glob("gradscape-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    for need in ("setup.py", "assets/player.js", "assets/gradscape.css", "tracer/summary/_fastsum.c",
                 "tracer/summary/_fastsum_v3.c", "tracer/summary/_fastsum_v4.c", "tracer/summary/_fastsum_wide.h",
                 "tracer/summary/_fastsum_thumb.h", "tracer/summary/_fastsum_simd.h", "app/ui/page.py",
                 "tracer/record/csrc/recorder.cpp",
                 "tracer/data/derivatives-2.13.0.json", "app/export/page/page.html", "gradscape/__init__.py"):
        assert need in names, f"the sdist lacks {need}"
    assert not [n for n in names if n.startswith(("gradscape/tracer/", "gradscape/app/", "gradscape/assets/"))]

    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
          str(sdist)], cwd=tmp_path)
    (wheel,) = dist.glob("gradscape-*.whl")
    _check_one_import_name(wheel, kernel=True)

    env_dir, purelib, bare = _install(tmp_path, wheel)
    run_dir = tmp_path / "cwd"
    run_dir.mkdir()
    _check_installed(env_dir, bare, run_dir)
    doctor = _run([str(env_dir / "bin" / "gradscape"), "doctor"], env=bare, cwd=run_dir).stdout
    assert "summariser: native\n" in doctor, doctor
    assert f"summary kernel: {purelib / 'gradscape' / 'tracer' / 'summary' / '_fastsum'}" in doctor, doctor
    assert f"gradscape: 0.1.0 ({purelib / 'gradscape'})" in doctor, doctor
    assert f"spill files: {tmp_path / 'data' / 'spill'}" in doctor

    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([str(env_dir / "bin" / "gradscape"), "serve", "--store", str(tmp_path / "s.sqlite"),
                               "--port", str(port)], env=bare, cwd=run_dir, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/api/runs", timeout=60)
        status, page = _get(base + "/")
        assert status == 200
        assert b"/assets/player.js" in page and b"/assets/gradscape.css" in page  # Dash found the folder
        status, js = _get(base + "/assets/player.js")
        assert status == 200 and js == (ROOT / "assets" / "player.js").read_bytes()
        status, css = _get(base + "/assets/gradscape.css")
        assert status == 200 and css == (ROOT / "assets" / "gradscape.css").read_bytes()
        check = _run([str(env_dir / "bin" / "gradscape"), "doctor", "--url", base], env=bare, cwd=run_dir).stdout
        assert f"server: {base}: a gradscape server answers (0 runs)" in check
    finally:
        server.terminate()
        server.wait(20)
        log.close()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
    assert list(run_dir.iterdir()) == []  # nothing written to the working directory


def test_doctor_reports_a_server_that_is_not_there() -> None:
    port = free_port()
    res = subprocess.run([sys.executable, "-m", "gradscape", "doctor", "--url", f"http://127.0.0.1:{port}"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 1
    assert f"server: http://127.0.0.1:{port}: no answer" in res.stdout
    assert f"torch: {torch.__version__}" in res.stdout
    assert "summariser: native\n" in res.stdout  # the kernel is built by the (editable) install


def test_torch_older_than_tested_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_compat.ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(ImportError, match=r"needs torch>=2\.9 .* this is torch 2\.4\.1\. "
                                          r"GRADSCAPE_ALLOW_UNTESTED_TORCH=1 tries it anyway"):
        _compat.check_torch("2.4.1")
    monkeypatch.setenv(_compat.ALLOW_UNTESTED_ENV, "1")
    _compat.check_torch("2.4.1")  # asked for: the private names are still each looked up
    monkeypatch.setenv(_compat.ALLOW_UNTESTED_ENV, "yes")  # only "1" counts
    with pytest.raises(ImportError, match="needs torch"):
        _compat.check_torch("2.8.0")
    for supported in ("2.9.0", "2.11.0", "2.13.0+cpu", "2.14.1+cu130"):
        _compat.check_torch(supported)
    for newer in ("2.15.1", "3.0.0"):
        said = rf"tested with torch 2\.9 to 2\.14; this is torch {newer}"
        with pytest.warns(_compat.UntestedTorchWarning, match=said):
            _compat.check_torch(newer)
    assert _compat.torch_version("2.13.0a0+git123") == (2, 13)


def test_spill_file_goes_to_the_user_data_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A live sink whose server is not there spills into GRADSCAPE_DATA_DIR/spill (the per-user data
    directory by default), not the working directory."""
    monkeypatch.setenv("GRADSCAPE_DATA_DIR", str(tmp_path / "data"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    sink = SocketSink(f"http://127.0.0.1:{free_port()}", "my/run", connect_timeout=0.5)
    assert sink.spill_path == str(tmp_path / "data" / "spill" / "gradscape-spill-my_run.sqlite")
    st = gradscape.trace((torch.nn.Parameter(torch.ones(3)) * 2).sum())
    with pytest.warns(RuntimeWarning, match="gradscape-spill-my_run.sqlite"):
        sink.write(st)
        sink.close(5.0)  # what the server did not take goes to the spill file
    assert sink.stats["spilled"] == 1
    with gradscape.TraceStore(sink.spill_path, readonly=True) as store:
        assert [(r["run"], r["steps"]) for r in store.runs()] == [(st.run, 1)]
    assert list(work.iterdir()) == []
    assert _paths.data_dir() == tmp_path / "data"
