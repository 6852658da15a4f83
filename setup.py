"""The build step pyproject.toml cannot declare: the summary kernel.

- `tracer/summary/_fastsum.c` is built as an optional compiled extension (a plain C shared library that
  `tracer/summary/kernel.py` loads with ctypes by its file path). When it cannot be built (no compiler,
  a compiler error), the install still succeeds and gradscape uses torch reductions instead, with
  one warning at run time saying why. Flags are portable: no `-march=native`, so a wheel runs on
  any machine of its platform tag. On x86-64 (GCC or Clang) the same source is also built for the
  x86-64-v3 (AVX2) and v4 (AVX-512) levels, and the loader picks the fastest one the CPU runs
  (the kernel is 2-4x faster with the wider vectors).

- The packages: pyproject.toml maps `gradscape.tracer` to tracer/, `gradscape.app` to app/ and
  `gradscape.assets` to assets/ (`[tool.setuptools.package-dir]`); `packages()` lists every package
  under those folders by that mapping, so a new subpackage needs no entry anywhere.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
KERNEL_SYMBOLS = ["gs_summarise_f32", "gs_summarise_bf16", "gs_summarise_f16", "gs_summarise_f64",
                  "gs_summarise_strided", "gs_cpu_level", "gs_round_bf16"]
# Value-safe except for the summation order (partial sums may be reassociated, which vectorises the
# loops); NaN and Inf keep their meaning (no -ffinite-math-only).
UNIX_FLAGS = ["-O3", "-std=c99", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math"]
MSVC_FLAGS = ["/O2", "/fp:precise"]
V3_FLAGS = ["-mavx2", "-mfma", "-mbmi", "-mbmi2", "-mf16c"]  # what gs_cpu_level() checks for level 3
V4_FLAGS = [*V3_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512cd", "-mavx512dq", "-mavx512vl"]
X86_64 = platform.machine().lower() in ("x86_64", "amd64") and os.name != "nt"


def packages() -> list[str]:
    """`gradscape`, its own subpackages, and those of tracer/ and app/ under their `gradscape.` names; the
    assets folder is a package of data only."""
    own = ["gradscape", *(f"gradscape.{p}" for p in find_packages(str(ROOT / "gradscape")))]
    mapped = [f"gradscape.{p}" for top in ("tracer", "app")
              for p in find_packages(str(ROOT), include=[top, f"{top}.*"])]
    return [*own, *mapped, "gradscape.assets"]


def kernel(name: str, flags: list[str]) -> Extension:
    return Extension(f"gradscape.tracer.summary.{name}", sources=[f"tracer/summary/{name}.c"],
                     depends=["tracer/summary/_fastsum.c", "tracer/summary/_fastsum_wide.h",
                              "tracer/summary/_fastsum_thumb.h", "tracer/summary/_fastsum_simd.h"],
                     extra_compile_args=flags, optional=True)


class BuildKernel(build_ext):
    """build_ext with per-compiler flags, for a library that is not a Python module (it exports the
    kernel's functions, not a PyInit_ function)."""

    def build_extension(self, ext: Extension) -> None:
        flags = MSVC_FLAGS if self.compiler.compiler_type == "msvc" else UNIX_FLAGS
        ext.extra_compile_args = [*flags, *ext.extra_compile_args]
        super().build_extension(ext)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return list(KERNEL_SYMBOLS)


setup(
    packages=packages(),
    ext_modules=[kernel("_fastsum", []), *([kernel("_fastsum_v3", V3_FLAGS), kernel("_fastsum_v4", V4_FLAGS)]
                                          if X86_64 else [])],
    cmdclass={"build_ext": BuildKernel},
)
