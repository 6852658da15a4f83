"""How the trace file keeps its rows (`tracer/store.py`): msgpack blobs compressed with zlib, and reads
of a big step with the cyclic garbage collector paused."""

from __future__ import annotations

import gc
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from gradscape.tracer.wire import TraceFormatError

_LEVEL = 6  # zlib's level: 1 measured ~15% bigger on a traced step, 9 no smaller than 6


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a step's objects are built. They form no cycles for it to
    find, but a big step makes hundreds of thousands of containers, and the full collections they set
    off measured over half of `read_step` (a 15k-node step read in a process holding a traced step:
    6.3 s, 2.5 s with the collector off)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def compress(blob: bytes) -> bytes:
    return zlib.compress(blob, _LEVEL)


def decompress(blob: bytes) -> bytes:
    """A stored blob's msgpack: a zlib stream since version 3, the msgpack itself before."""
    if blob[:1] != b"\x78":
        return blob
    try:
        return zlib.decompress(blob)
    except zlib.error as exc:
        raise TraceFormatError(f"a stored blob is not a zlib stream: {exc}") from exc
