"""The optional one-pass summary kernel (`_fastsum.c`), compiled on first use and loaded with ctypes.

Nothing here is required: without a C compiler, or with GRADSCAPE_NATIVE=0, `native()` returns
None and summaries use torch reductions instead (same numbers, more passes). The shared library is
cached per source hash and machine under the user's cache directory.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)
_SRC = Path(__file__).with_name("_fastsum.c")
_FLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
          "-fassociative-math", "-std=c99"]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradscape"


def _cpu_id() -> bytes:
    """The CPU's feature flags: the kernel is built with -march=native, so a cached build must not
    travel to a machine with other instructions (a shared home directory, say)."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            for line in f:
                if line.startswith(b"flags"):
                    return line
    except OSError:
        pass
    return platform.processor().encode()


def _build(target: Path) -> bool:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        res = subprocess.run([cc, *_FLAGS, "-o", str(out), str(_SRC), "-lm"], capture_output=True, text=True,
                             timeout=120)
        if res.returncode != 0:
            log.info("gradscape: building the summary kernel failed: %s", res.stderr.strip()[:500])
            return False
        os.replace(out, target)  # atomic: concurrent processes never load a half-written file
    return True


@lru_cache(maxsize=1)
def native() -> ctypes.CDLL | None:
    """The loaded kernel, or None (then the torch fallback is used)."""
    if os.environ.get("GRADSCAPE_NATIVE", "1") == "0":
        return None
    try:
        digest = hashlib.sha256(_SRC.read_bytes() + " ".join(_FLAGS).encode() + _cpu_id()).hexdigest()[:16]
        target = _cache_dir() / f"fastsum-{digest}-{platform.system()}-{platform.machine()}.so"
        if not target.exists() and not _build(target):
            return None
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("gradscape: summary kernel unavailable (%s); using torch reductions", exc)
        return None
    ptr = ctypes.c_void_p
    for name in ("gs_summarise_f32", "gs_summarise_bf16"):  # (x, geometry, out) -> status
        fn = getattr(lib, name)
        fn.argtypes = [ptr, ptr, ptr]  # few arguments: ctypes converts each one on every call
        fn.restype = ctypes.c_int
    return lib
