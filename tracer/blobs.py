"""How the trace file keeps its rows (`tracer/store.py`): msgpack blobs compressed with zlib."""

from __future__ import annotations

import zlib

from gradscape.tracer.wire import TraceFormatError

# zlib's level: the 60 MB graph row of a 100k-node step deflates in 0.53 s at 3 and 1.7 s at 6, 9% bigger,
# which is 2-5% of the file (bench/size.py: 334 -> 340 bytes a node at 25k nodes, 127 -> 133 at 100k)
_LEVEL = 3


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
