"""The benchmark process's memory behaviour: minor page faults, and glibc's heap held steady.

On glibc, a block of 128 KB or more comes from its own mapping until one is freed, and the top of the
heap is given back to the system once more than twice that is free there (both thresholds move as the
process frees large blocks). Depending on the heap's layout, a training step's activations can land on
new pages every step: a plain LeNet step (W2) read 4.75 ms in one process and 7.46 ms in another of the
same script, with 0 and 1,151 page faults a step. A traced step's own buffers change that layout, so a
ratio to a plain step moves with it. `steady_malloc` fixes both thresholds, which glibc then stops
moving, so the benchmark measures the tracer's work rather than the heap's luck; the benchmarks print
the page faults either way.
"""

from __future__ import annotations

import ctypes
import os

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
STEADY_BYTES = 256 << 20


def page_faults() -> int:
    """Minor page faults of this process so far (-1 where `resource` is missing: Windows)."""
    try:
        import resource
    except ImportError:
        return -1
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def steady_malloc() -> str:
    """Fix glibc's mmap and trim thresholds at `STEADY_BYTES` for this process; what was done, in words."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "glibc's mallopt is not here: the allocator's defaults"
    ok = mallopt(_M_MMAP_THRESHOLD, STEADY_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD, STEADY_BYTES) == 1
    return f"glibc heap held: mmap and trim thresholds {STEADY_BYTES >> 20} MB" if ok else "mallopt refused"


def page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
