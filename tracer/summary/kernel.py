"""The optional one-pass summary kernel (`_fastsum.c`), built at install time and loaded with ctypes.

`pip install` builds `_fastsum.c` into a shared library next to this file (setup.py: an optional
extension, so an install without a working C compiler still succeeds). Nothing is compiled at run
time. When the library is not there, or cannot be loaded, `native()` returns None, summaries use
torch reductions instead (the same numbers, in more passes), and one warning says why. With
GRADSCAPE_NATIVE=0 the kernel is not used and nothing is said: the user asked for it.

`check_geometry` is the kernel's contract written in Python: every call's geometry is checked
against the tensor and the output buffer before the kernel ever sees it (once per shape: the plan
that holds the geometry is made once per shape), so a mismatch raises instead of writing past a
buffer.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import math
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
# each (x, geometry, out) -> status
_SYMBOLS = ("gs_summarise_f32", "gs_summarise_bf16", "gs_summarise_f16", "gs_summarise_f64")


class KernelGeometryError(ValueError):
    """A kernel call whose geometry does not fit its tensor or its output buffer."""


def library_path(name: str = "_fastsum") -> Path | None:
    """A built kernel next to this module (`name` + this interpreter's extension suffix), or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = _HERE / f"{name}{suffix}"
        if p.is_file():
            return p
    return None


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name in _SYMBOLS:
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p] * 3  # few arguments: ctypes converts each one on every call
        fn.restype = ctypes.c_int
    rounding = getattr(lib, "gs_round_bf16", None)  # (a build older than it has none: `round_bf16`)
    if rounding is not None:
        rounding.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        rounding.restype = None
    return lib


@lru_cache(maxsize=1)
def _loaded() -> tuple[ctypes.CDLL | None, Path | None, str]:
    """(the kernel or None, its file, why not). The baseline build must load; on x86-64 it says
    which instruction-set build (`_fastsum_v4`, `_fastsum_v3`) this CPU runs, and that one is used
    where it was built."""
    if os.environ.get("GRADSCAPE_NATIVE", "1") == "0":
        return None, None, "GRADSCAPE_NATIVE=0"
    path = library_path()
    if path is None:
        return None, None, (f"the summary kernel was not built when gradscape was installed (no _fastsum library "
                            f"in {_HERE}; a C compiler is needed at install time)")
    try:
        lib = _load(path)
    except (OSError, AttributeError) as exc:
        return None, None, f"the summary kernel at {path} could not be loaded: {exc}"
    for faster in reversed(_runnable(lib)):  # the highest level first
        try:
            return _load(faster), faster, ""
        except (OSError, AttributeError):
            pass  # the baseline build does the same work
    return lib, path, ""


def _runnable(base: ctypes.CDLL) -> list[Path]:
    """The instruction-set builds (`_fastsum_v3`, `_fastsum_v4`) there are and that the baseline build `base` says
    this CPU runs, lowest first."""
    level_fn = getattr(base, "gs_cpu_level", None)
    level = int(level_fn()) if level_fn is not None else 0
    return [p for lv in (3, 4) if level >= lv and (p := library_path(f"_fastsum_v{lv}")) is not None]


def builds() -> list[Path]:
    """Every build of the kernel next to this module that this CPU runs, the baseline first (the tests and
    `bench/kernel_builds.py` run each one); [] when the baseline build is not there."""
    base = library_path()
    return [] if base is None else [base, *_runnable(_load(base))]


def status() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded kernel or None, why not); the reason is "" when the kernel is loaded."""
    lib, _, why = _loaded()
    return lib, why


def round_bf16() -> Any:
    """The loaded kernel's `gs_round_bf16(cells, n)` (float32 cells rounded in place to bfloat16's precision), or
    None when no kernel is loaded or it was built before it had one."""
    return getattr(_loaded()[0], "gs_round_bf16", None)


def kernel_path() -> Path | None:
    """The file of the kernel in use, or None."""
    return _loaded()[1]


def native() -> ctypes.CDLL | None:
    """The loaded kernel, or None (then the torch fallback is used; the first such call warns why)."""
    lib, why = status()
    if lib is None and why != "GRADSCAPE_NATIVE=0":
        _warn_once(why)
    return lib


@lru_cache(maxsize=1)
def _warn_once(why: str) -> None:
    warnings.warn(f"gradscape: {why}; gradient summaries use torch reductions instead (same numbers, slower)",
                  RuntimeWarning, stacklevel=4)


def summariser() -> str:
    """What summarises gradients: "native", or "torch (why)"."""
    lib, why = status()
    return "native" if lib is not None else f"torch ({why})"


def check_geometry(n: int, geometry: list[int], thumb_shape: tuple[int, int] | None, buffer_bytes: int) -> None:
    """Raise KernelGeometryError unless the kernel, called on a contiguous tensor of `n` elements with
    `[n, *geometry]` and an output buffer of `buffer_bytes`, reads only the tensor and writes only the
    buffer. geometry = [planes, R, C, kr, kc, gc] (see `_fastsum.c`); the thumbnail is
    ceil(planes/gc)·ceil(R/kr) rows of gc·ceil(C/kc) float32 cells after 8 doubles of statistics."""
    if len(geometry) != 6:
        raise KernelGeometryError(f"kernel geometry needs 6 numbers [planes, R, C, kr, kc, gc], got {geometry}")
    planes, rows, cols, kr, kc, gc = geometry
    if n < 0 or n >= 2**63 // 8:
        raise KernelGeometryError(f"kernel geometry: bad element count {n}")
    need = 8 * 8
    if planes < 0:
        raise KernelGeometryError(f"kernel geometry: negative plane count {planes}")
    if planes > 0:
        if min(rows, cols, kr, kc, gc) < 1:
            raise KernelGeometryError(f"kernel geometry: R, C, kr, kc and gc must be positive, got {geometry}")
        if planes * rows * cols > n:
            raise KernelGeometryError(f"kernel geometry: {planes} planes of {rows}×{cols} read past a tensor of "
                                      f"{n} elements")
        t_rows, t_cols = math.ceil(rows / kr), math.ceil(cols / kc)
        shape = (math.ceil(planes / gc) * t_rows, gc * t_cols)
        if thumb_shape != shape:
            raise KernelGeometryError(f"kernel geometry {geometry} makes a {shape[0]}×{shape[1]} thumbnail, "
                                      f"expected {thumb_shape}")
        need += 4 * shape[0] * shape[1]
    if buffer_bytes < need:
        raise KernelGeometryError(f"kernel output buffer of {buffer_bytes} bytes, the kernel writes {need}")
