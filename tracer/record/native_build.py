"""Building the native recorder (`csrc/`) against the torch that is installed, and finding it again.

A C++ extension of torch works with the torch release it was compiled against, and no other, so it is
built on the user's machine, after torch is installed, and not by pip (pip would build it in an isolated
environment holding some other torch): `gradscape build-recorder` (the Makefile runs it after the
install) compiles `csrc/recorder.cpp` with the C++ compiler (CXX, else c++) into a cache folder
(GRADSCAPE_CACHE_DIR, else the per-user cache folder of platformdirs), under a name that holds the torch
release, the Python ABI and a hash of the sources. A torch upgraded since, or sources changed since,
then simply find no build of theirs: gradscape records in Python and `gradscape doctor` says why.
It takes about 40 s (torch's headers are large) and is never started by tracing itself.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

import platformdirs
import torch

from gradscape.tracer import _compat

SOURCE_DIR = Path(__file__).resolve().with_name("csrc")
MAIN = "recorder.cpp"


class BuildError(RuntimeError):
    """The native recorder could not be built (no compiler, or the compiler refused the source)."""


def cache_dir() -> Path:
    env = os.environ.get("GRADSCAPE_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("gradscape", appauthor=False)) / "native"


def _sources() -> list[Path]:
    return sorted(p for p in SOURCE_DIR.iterdir() if p.suffix in (".cpp", ".h"))


def target() -> Path:
    """Where the build for this torch, this Python and these sources is (or will be)."""
    digest = hashlib.blake2b(digest_size=8)
    for path in _sources():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    release = re.sub(r"[^A-Za-z0-9.]", "_", torch.__version__)
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return cache_dir() / f"_recorder-torch{release}-{digest.hexdigest()}{suffix}"


def compiler() -> list[str]:
    """The C++ compiler's command (CXX may hold a command with arguments)."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shlex.split(cxx)
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return [found]
    raise BuildError("no C++ compiler found (install g++ or clang++, or set CXX)")


def torch_includes(root: Path) -> list[Path]:
    """The include folders of the torch whose headers are under `root` (a torch package's `include/`)."""
    return [root, root / "torch" / "csrc" / "api" / "include"]


def syntax_command(torch_include: Path) -> list[str]:
    """The compiler's command that checks the sources against the torch headers under `torch_include`
    (of any release, installed or not) without building: how `make test` compiles the version shims
    (csrc/torch_shims.h) against the floor's and the newest release's headers."""
    include = [f"-I{p}" for p in [*torch_includes(torch_include), sysconfig.get_paths()["include"]]]
    return [*compiler(), "-fsyntax-only", "-std=c++20", '-DGS_TORCH_VERSION="syntax check"', *include,
            str(SOURCE_DIR / MAIN)]


def command(output: Path, source: Path = SOURCE_DIR / MAIN) -> list[str]:
    """The compiler's command line for the build (of `source`: bench/light_floor.py builds another with it)."""
    from torch.utils import cpp_extension

    include = [f"-I{p}" for p in [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]]
    libs = cpp_extension.library_paths()
    abi = int(_compat.cxx11_abi)
    return [*compiler(), "-O2", "-shared", "-fPIC", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f'-DGS_TORCH_VERSION="{torch.__version__}"', *include, str(source),
            *[f"-L{p}" for p in libs], *[f"-Wl,-rpath,{p}" for p in libs],
            "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10", "-o", str(output)]


def build(force: bool = False) -> Path:
    """Build the native recorder for the torch that is imported, unless a build is there already.
    Returns the built file; raises BuildError saying what the compiler said."""
    out = target()
    if out.exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        partial = Path(tmp) / out.name
        done = subprocess.run(command(partial), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            words = (done.stderr or done.stdout).strip().splitlines()
            first = next((w for w in words if "error" in w), words[-1] if words else "")
            failed(out).write_text(f"torch {torch.__version__}: {first.strip()}\n")
            tail = "\n".join(words[-20:])
            raise BuildError(f"the C++ compiler failed (exit {done.returncode}) for torch {torch.__version__}:\n{tail}")
        os.replace(partial, out)  # atomic: a process loading it never sees half a file
    failed(out).unlink(missing_ok=True)
    return out


def failed(out: Path) -> Path:
    """The note a failed build leaves beside where its file would be: the compiler's first error, which
    `gradscape doctor` and a step's `meta["recorder"]` ("python (why)") quote while steps are recorded in Python."""
    return out.with_name(out.name + ".failed")
