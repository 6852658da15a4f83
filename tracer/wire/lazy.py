"""A stored step read for the page: every field decoded but the node and tensor maps, which are decoded one at
a time when read (`LazyItems`), and the step's index (NOTE [Step index]) beside them (`IndexedWire`).

The store writes the step's document with `pack_step`: its nodes and tensors last, packed one by one, so
where each item starts is known without reading the document (`spans`, kept with the step's index); the
rest of the document is read as a whole. Finding the items by msgpack's `skip` instead took 0.08 s for the
60 MB document of a 100,002-node step (decoding it all: 0.46 s). Reading all the items of a `LazyItems`
(iterating it) decodes them in one call, as reading the whole step would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast, overload

import msgpack
import numpy as np

from gradscape.tracer.collector import collector_paused
from gradscape.tracer.wire.codec import unpack
from gradscape.tracer.wire.step_index import StepIndex, index_from_wire
from gradscape.tracer.wire.types import TraceFormatError, WireStep

LAZY_KEYS = ("nodes", "tensors")


class LazyItems(Sequence[Any]):
    """`n` items, item k made by `one(k)` when first read and kept; `every()` makes them all at once."""

    def __init__(self, n: int, one: Callable[[int], Any], every: Callable[[], list[Any]]) -> None:
        self._one, self._every = one, every
        self._items: list[Any] = [None] * n
        self._all = False
        # how the items are decoded all at once (a search over every node): with the collector paused, as
        # every big conversion (NOTE [Collector paused]); the page's server freezes them too (`made_frozen`)
        self.decode_with: Callable[[Callable[[], list[Any]]], list[Any]] = _paused

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
            item = self._items[k] = self._one(k)
        return item

    def __iter__(self) -> Iterator[Any]:
        if not self._all:
            if self._items:
                every = self.decode_with(self._every)
                self._items = [old if old is not None else new for old, new in zip(self._items, every)]
            self._all = True
        return iter(self._items)

    def __eq__(self, other: object) -> bool:  # as the list it stands for
        if isinstance(other, (list, LazyItems)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LazyItems({len(self)} items)"


def _packed(raw: bytes, offsets: list[int]) -> LazyItems:
    """The items of a msgpack array inside `raw`, item k spanning `offsets[k]:offsets[k + 1]`."""
    view = memoryview(raw)
    head = b"\xdd" + (len(offsets) - 1).to_bytes(4, "big")  # a msgpack array of n items, then the items

    def one(k: int) -> Any:
        return unpack(view[offsets[k]:offsets[k + 1]])

    return LazyItems(len(offsets) - 1, one, lambda: unpack(head + view[offsets[0]:offsets[-1]]))


def _paused(make: Callable[[], list[Any]]) -> list[Any]:
    with collector_paused():
        return make()


def decode_all_with(wire: Any, how: Callable[[Callable[[], list[Any]]], list[Any]]) -> None:
    """Decode the lazy items of `wire`, when they are read all at once, through `how` (`LazyItems.decode_with`)."""
    for key in LAZY_KEYS:
        if isinstance(items := wire.get(key), LazyItems):
            items.decode_with = how


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


def pack_step(graph: Mapping[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """`graph` as msgpack (a map, read back as `unpack` reads any), its `nodes` and `tensors` last, and
    where their items are (`read_lazily`'s `spans`): per key, the offset of its first item and every
    item's length (little-endian uint32)."""
    p = msgpack.Packer(use_bin_type=True)
    parts = [p.pack_map_header(len(graph))]
    for key, value in graph.items():
        if key not in LAZY_KEYS:
            parts += [p.pack(key), p.pack(value)]
    pos = sum(map(len, parts))
    spans: dict[str, Any] = {}
    for key in LAZY_KEYS:
        if key in graph:
            items = [p.pack(x) for x in graph[key]]
            head = p.pack(key) + p.pack_array_header(len(items))
            lengths = np.fromiter(map(len, items), np.uint32, len(items))
            spans[key] = [pos + len(head), lengths.astype("<u4").tobytes()]
            parts += [head, *items]
            pos += len(head) + int(lengths.sum())
    return b"".join(parts), spans


def read_lazily(raw: bytes, spans: Mapping[str, Any]) -> dict[str, Any]:
    """The step map in `raw` as `pack_step` wrote it, with `nodes` and `tensors` as `LazyItems` at `spans`."""
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
