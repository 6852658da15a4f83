"""How the trace file keeps its rows (`tracer/store.py`): msgpack blobs compressed with Zstandard.

A 100,002-node step's graph row is 60 MB of msgpack. Zstandard at level 3 makes it 8.6 MB in 0.10 s and
reads it back in 0.05 s; zlib, which version 3 of the file used, made 9.4 MB in 0.34 s (level 3) and read
it back in 0.13 s (one process, best of 3 each).
"""

from __future__ import annotations

import threading
import zlib

import zstandard

from gradscape.tracer.wire import TraceFormatError

_LEVEL = 3  # level 1 was 1% bigger for 40% less time on that row; 5 5% smaller in 2.4 times as long

# a blob under this many bytes is kept as it is: the 50,218 thumbnail rows of a 100k-node step (median
# 86 bytes) came out bigger compressed, and compressing each one costs its set-up
_SMALL = 512

_ZSTD = b"\x28\xb5\x2f\xfd"  # a Zstandard frame's first four bytes
_ZLIB = b"\x78"  # a zlib stream's first byte (the rows of version 3)

_local = threading.local()  # a compressor and a decompressor per thread: neither may be shared by two at once


def compress(blob: bytes) -> bytes:
    """A row as stored: a Zstandard frame, or as it is when small (`_SMALL`). A msgpack document never starts
    with the frame's first byte (0x28 is a positive fixint, never a whole row), nor with zlib's (0x78), so
    `decompress` tells the three apart."""
    if len(blob) < _SMALL:
        return blob
    if not hasattr(_local, "c"):
        _local.c = zstandard.ZstdCompressor(level=_LEVEL)
    return _local.c.compress(blob)


def decompress(blob: bytes) -> bytes:
    """A stored blob's msgpack: a Zstandard frame since version 4 of the file, a zlib stream in version 3
    (both apart from small rows, kept as they are), the msgpack itself before."""
    try:
        if blob[:4] == _ZSTD:
            if not hasattr(_local, "d"):
                _local.d = zstandard.ZstdDecompressor()
            return _local.d.decompress(blob)
        if blob[:1] == _ZLIB:
            return zlib.decompress(blob)
    except (zstandard.ZstdError, zlib.error) as exc:
        raise TraceFormatError(f"a stored blob is not a Zstandard frame or a zlib stream: {exc}") from exc
    return blob
