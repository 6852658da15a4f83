"""gradscape as a package: what a wheel holds, the install-time summary kernel, the torch gate, where
files go. The slow test builds an sdist and a wheel from it, installs the wheel into a fresh
environment and runs it with no C compiler on PATH."""

from __future__ import annotations

import ctypes
import math
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
from gradscape.tracer.summary import fastpath as _summary
from gradscape.tracer.summary import kernel as _native

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


def test_missing_kernel_warns_once_and_summaries_use_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_native, "_HERE", tmp_path)  # an install whose kernel was not built
    _native._loaded.cache_clear()
    _native._warn_once.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="summary kernel was not built when gradscape was installed"):
            assert _native.native() is None
        assert _native.native() is None  # once: a second call says nothing (warnings are errors here)
        assert _native.summariser().startswith("torch (the summary kernel was not built")
        g = torch.tensor([[1.0, -2.0], [3.0, 0.0]])
        assert _summary.native_summary(g, 8) is None
        st = gradscape.trace((torch.nn.Parameter(g) * 2).sum())
        assert st.nodes
    finally:
        monkeypatch.undo()
        _native._loaded.cache_clear()
        _native._warn_once.cache_clear()
    assert _native.summariser() == "native"


def test_native_off_by_environment_says_so_without_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADSCAPE_NATIVE", "0")
    _native._loaded.cache_clear()
    try:
        assert _native.native() is None
        assert _native.summariser() == "torch (GRADSCAPE_NATIVE=0)"
    finally:
        monkeypatch.undo()
        _native._loaded.cache_clear()


def _kernel_run(lib: ctypes.CDLL, x: torch.Tensor, size: int) -> tuple[list[float], list[float]]:
    geometry, th = _summary._native_geometry(tuple(x.shape), size)
    k = th[0] * th[1] if th else 0
    geom = (ctypes.c_int64 * 7)(x.numel(), *geometry)
    buf = (ctypes.c_double * (8 + (k + 1) // 2))()
    fn = {torch.float32: lib.gs_summarise_f32, torch.bfloat16: lib.gs_summarise_bf16,
          torch.float16: lib.gs_summarise_f16}[x.dtype]
    assert fn(x.data_ptr(), geom, buf) == 0
    thumb = (ctypes.c_float * k).from_buffer(buf, 64)
    return list(buf[:8]), list(thumb)


def _builds() -> list[Path]:
    builds = _native.builds()
    assert builds, "the summary kernel was not built"
    return builds


def test_every_instruction_set_build_gives_the_known_values() -> None:
    """Each build of the kernel that this machine runs (baseline, x86-64-v3, v4) against values
    computed in float64 by torch."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 53, generator=g)
    x[3, 5], x[10, 1], x[20, 20] = math.nan, math.inf, 0.0
    for path in _builds():
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            stats, thumb = _kernel_run(_native._load(path), xd, 8)
            fd = xd.double()[torch.isfinite(xd.double())]
            want = [fd.min().item(), fd.max().item(), fd.sum().item(), (fd * fd).sum().item(),
                    float((fd != 0).sum()), 1.0, 1.0, float(fd.numel())]
            assert stats[:2] == want[:2] and stats[4:] == want[4:], path.name
            assert stats[2:4] == pytest.approx(want[2:4], rel=1e-5), path.name
            # block means of 5×7 blocks (ceil(37/8), ceil(53/8)); a block holding NaN or Inf shows it
            blocks = xd.double()
            rows = [blocks[i:i + 5] for i in range(0, 37, 5)]
            means = [r[:, j:j + 7].mean().item() for r in rows for j in range(0, 53, 7)]
            assert thumb == pytest.approx(means, rel=1e-5, nan_ok=True), path.name


@pytest.mark.parametrize("n", [1, 63, 64, 4096 + 1000, 3 * 4096])
def test_every_build_summarises_an_all_finite_tensor(n: int) -> None:
    """The all-finite chunk, which the v3 and v4 builds write with intrinsics (eight and sixteen lanes,
    then a scalar tail): lengths below one vector step, one exact step, a chunk and a tail, whole chunks.
    Zeros of both signs and subnormals are counted as torch counts them; the extremes are exact."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, generator=g) * 3
    x[::7] = 0.0
    x[3::11] = -0.0
    x[5::13] = 1e-40  # subnormal in float32
    x[n // 2] = -123.5
    fd = x.double()
    want = [fd.min().item(), fd.max().item(), fd.sum().item(), (fd * fd).sum().item(), float((fd != 0).sum()),
            0.0, 0.0, float(n)]
    for path in _builds():
        stats, _ = _kernel_run(_native._load(path), x.reshape(1, n), 8)
        assert stats[:2] == want[:2] and stats[4:] == want[4:], path.name
        assert abs(stats[2] - want[2]) <= 1e-6 * fd.abs().sum().item(), path.name  # float sums: vs Σ|x|
        assert stats[3] == pytest.approx(want[3], rel=1e-5), path.name


def test_every_build_widens_every_float16_exactly() -> None:
    """Each build (the v3 and v4 ones convert with the CPU's F16C instructions eight at a time, the
    baseline with integer arithmetic) widens all 65,536 float16 bit patterns exactly, subnormals
    included, and a tail that is not a multiple of eight: a thumbnail of one cell per value is
    `x.float()` itself, and the statistics are torch's in float64."""
    patterns = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    g = torch.Generator().manual_seed(5)
    tail = (torch.randn(251 * 263 - patterns.numel(), generator=g) * 1e-6).half()  # mostly subnormal
    x = torch.cat([patterns, tail]).reshape(251, 263)
    fin = x.double()[torch.isfinite(x.double())]
    for path in _builds():
        stats, thumb = _kernel_run(_native._load(path), x, 263)
        assert thumb == pytest.approx(x.float().flatten().tolist(), abs=0, rel=0, nan_ok=True), path.name
        assert stats[:2] == [fin.min().item(), fin.max().item()], path.name
        assert stats[4:] == [float((fin != 0).sum()), float(torch.isnan(x).sum()), 2.0, float(fin.numel())], path.name
        assert abs(stats[2] - fin.sum().item()) <= 1e-6 * fin.abs().sum().item(), path.name  # float sums: vs Σ|x|
        assert stats[3] == pytest.approx((fin * fin).sum().item(), rel=1e-5), path.name


@pytest.mark.parametrize(("n", "geometry", "thumb", "nbytes", "message"), [
    (100, [1, 10, 10, 2, 2], (5, 5), 164, "6 numbers"),
    (100, [1, 10, 11, 2, 2, 1], (5, 6), 184, "read past a tensor of 100 elements"),
    (100, [1, 10, 10, 0, 2, 1], (5, 5), 164, "must be positive"),
    (100, [1, 10, 10, 2, 2, 1], (4, 5), 164, "makes a 5×5 thumbnail, expected (4, 5)"),
    (100, [1, 10, 10, 2, 2, 1], (5, 5), 160, "buffer of 160 bytes, the kernel writes 164"),
    (100, [-1, 10, 10, 2, 2, 1], None, 64, "negative plane count"),
])
def test_kernel_geometry_is_checked_before_any_call(n: int, geometry: list[int], thumb: tuple[int, int] | None,
                                                    nbytes: int, message: str) -> None:
    with pytest.raises(_native.KernelGeometryError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _native.check_geometry(n, geometry, thumb, nbytes)


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 200), (130, 70), (2, 3, 4, 5), (2, 17, 9, 33)])
def test_every_plan_the_summariser_makes_passes_the_check(shape: tuple[int, ...]) -> None:
    """Every shape the summariser plans for (empty tensors never reach the kernel) passes the check."""
    for size in (0, 1, 8, 64):
        geometry, th = _summary._native_geometry(shape, size)
        k = th[0] * th[1] if th else 0
        _native.check_geometry(math.prod(shape), geometry, th, 8 * (8 + (k + 1) // 2))


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
