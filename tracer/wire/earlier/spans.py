"""An earlier release's stored maps read lazily: the step's document held its nodes and tensors last, packed one
by one, and where each item starts (`spans`, kept with the step's index), so the rest of the document is read
as a whole and each node or tensor map is decoded when read (`LazyItems`). Finding the items by msgpack's
`skip` instead took 0.08 s for the 60 MB document of a 100,002-node step (decoding it all: 0.46 s). NOTE [Maps
of earlier releases] in __init__.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from gradscape.tracer.wire.codec import unpack
from gradscape.tracer.wire.lazy import LAZY_KEYS, LazyItems
from gradscape.tracer.wire.types import TraceFormatError


def _packed(raw: bytes, offsets: list[int]) -> LazyItems:
    """The items of a msgpack array inside `raw`, item k spanning `offsets[k]:offsets[k + 1]`."""
    view = memoryview(raw)
    head = b"\xdd" + (len(offsets) - 1).to_bytes(4, "big")  # a msgpack array of n items, then the items

    def one(k: int) -> Any:
        return unpack(view[offsets[k]:offsets[k + 1]])

    return LazyItems(len(offsets) - 1, one, lambda: unpack(head + view[offsets[0]:offsets[-1]]))



def read_lazily(raw: bytes, spans: Mapping[str, Any]) -> dict[str, Any]:
    """The step map in `raw` as an earlier release's store wrote it, with `nodes` and `tensors` as `LazyItems`
    at `spans`."""
    try:
        lazy = {key: _offsets(spans[key], len(raw)) for key in LAZY_KEYS}
        u = msgpack.Unpacker(None, raw=False, strict_map_key=False, max_buffer_size=len(raw))
        u.feed(memoryview(raw)[:lazy["nodes"][0]])  # the fields before the nodes' items
        out: dict[str, Any] = {}
        for _ in range(u.read_map_header() - len(LAZY_KEYS)):
            key = u.unpack()
            if key in LAZY_KEYS:
                raise TraceFormatError(f"{key!r} is not where its spans say")
            out[key] = u.unpack()
    except (KeyError, TypeError, ValueError) as exc:  # msgpack's errors are ValueErrors
        raise TraceFormatError(f"not a step document with its spans: {exc!r}") from exc
    if lazy["tensors"][-1] != len(raw):
        raise TraceFormatError("the step document's tensors do not end where their spans say")
    return {**out, **{key: _packed(raw, offsets) for key, offsets in lazy.items()}}


def _offsets(span: Any, size: int) -> list[int]:
    start, lengths = span
    offsets = np.empty(len(lengths) // 4 + 1, np.int64)
    offsets[0] = start
    np.cumsum(np.frombuffer(lengths, "<u4"), out=offsets[1:])
    offsets[1:] += start
    if offsets[-1] > size:
        raise ValueError("spans past the end of the document")
    return offsets.tolist()
