"""A stored step read for the page: every field decoded but the node and tensor maps, which are decoded one at
a time when read (`LazyItems`), and the step's index (NOTE [Step index]) beside them (`IndexedWire`).

Finding where each map starts takes one pass of msgpack's `skip` over the document (0.09 s for the 60 MB
document of a 100,002-node step, against 0.46 s to decode it); reading all the items of a `LazyItems`
(iterating it) decodes them in one call, as reading the whole step would.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast, overload

import msgpack

from gradscape.tracer.wire.codec import unpack
from gradscape.tracer.wire.step_index import StepIndex, index_from_wire
from gradscape.tracer.wire.types import TraceFormatError, WireStep

LAZY_KEYS = ("nodes", "tensors")


class LazyItems(Sequence[Any]):
    """The items of a msgpack array inside `raw`, item k spanning `offsets[k]:offsets[k + 1]`, each decoded
    when first read and kept."""

    def __init__(self, raw: bytes, offsets: list[int]) -> None:
        self._raw = memoryview(raw)
        self._offsets = offsets
        self._items: list[Any] = [None] * (len(offsets) - 1)
        self._all = False

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, k: int) -> Any: ...

    @overload
    def __getitem__(self, k: slice) -> list[Any]: ...

    def __getitem__(self, k: int | slice) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        item = self._items[k]  # IndexError past the end, as a list's
        if item is None:
            k = k % len(self._items)
            item = self._items[k] = unpack(self._raw[self._offsets[k]:self._offsets[k + 1]])
        return item

    def __iter__(self) -> Iterator[Any]:
        if not self._all:
            self._decode_all()
        return iter(self._items)

    def __eq__(self, other: object) -> bool:  # as the list it stands for
        if isinstance(other, (list, LazyItems)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LazyItems({len(self)} items)"

    def _decode_all(self) -> None:
        n = len(self._items)
        if n:
            head = b"\xdd" + n.to_bytes(4, "big")  # a msgpack array of n items, then the items as stored
            every = unpack(head + self._raw[self._offsets[0]:self._offsets[-1]])
            self._items = [old if old is not None else new for old, new in zip(self._items, every)]
        self._all = True


class IndexedWire(dict):  # type: ignore[type-arg]
    """A step's wire form (`WireStep`'s keys) with its index (`index`): `nodes` and `tensors` may be
    `LazyItems`."""

    def __init__(self, fields: Mapping[str, Any], index: StepIndex) -> None:
        super().__init__(fields)
        self.index = index


def indexed(wire: WireStep) -> WireStep:
    """`wire` with its index: itself when it has one, else an `IndexedWire` of its fields with the index made
    from its maps (one pass over the nodes, for a caller that reads the index many times)."""
    if isinstance(wire, IndexedWire):
        return cast(WireStep, wire)
    return cast(WireStep, IndexedWire(wire, index_from_wire(wire)))


def read_lazily(raw: bytes) -> dict[str, Any]:
    """The step map in `raw` (msgpack), with `nodes` and `tensors` as `LazyItems`."""
    u = msgpack.Unpacker(None, raw=False, strict_map_key=False, max_buffer_size=max(len(raw), 1))
    u.feed(raw)
    out: dict[str, Any] = {}
    try:
        for _ in range(u.read_map_header()):
            key = u.unpack()
            if key in LAZY_KEYS:
                offsets = [0] * (u.read_array_header() + 1)
                offsets[0] = u.tell()
                for k in range(1, len(offsets)):
                    u.skip()
                    offsets[k] = u.tell()
                out[key] = LazyItems(raw, offsets)
            else:
                out[key] = u.unpack()
    except Exception as exc:  # msgpack's errors: a damaged document
        raise TraceFormatError(f"not a msgpack step document: {exc}") from exc
    return out
