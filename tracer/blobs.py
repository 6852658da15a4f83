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


# a blob under this many bytes is kept as it is: the 50,218 thumbnail rows of a 100k-node step (median
# 86 bytes) came out 4% bigger deflated, and deflating them took 3 s, zlib's set-up for every call
_SMALL = 512


def compress(blob: bytes) -> bytes:
    """A row as stored: deflated, or as it is when small (`_SMALL`). A msgpack document never starts with
    zlib's first byte (0x78 is a positive fixint, never a whole row), so `decompress` tells them apart."""
    return blob if len(blob) < _SMALL else zlib.compress(blob, _LEVEL)


def decompress(blob: bytes) -> bytes:
    """A stored blob's msgpack: a zlib stream since version 3 (apart from small rows, kept as they are),
    the msgpack itself before."""
    if blob[:1] != b"\x78":
        return blob
    try:
        return zlib.decompress(blob)
    except zlib.error as exc:
        raise TraceFormatError(f"a stored blob is not a zlib stream: {exc}") from exc
