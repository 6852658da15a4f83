"""A stored step read for the page: every field decoded but the node and tensor maps, which are made one at a
time when read (`LazyItems`: from a column document's columns, or an earlier release's packed maps,
`earlier/spans.py`), and the step's index (NOTE [Step index]) and a column document's `StepColumns` beside
them (`IndexedWire`: the page reads what it asks of every node from those, not from the maps). Reading all
the items of a `LazyItems` (iterating it) makes them in one call, as reading the whole step would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast, overload

from gradscape.tracer.collector import collector_paused
from gradscape.tracer.wire.step_index import StepIndex, index_from_wire
from gradscape.tracer.wire.types import WireStep

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

    def __init__(self, fields: Mapping[str, Any], index: StepIndex, columns: Any = None) -> None:
        super().__init__(fields)
        self.index = index
        # the `StepColumns` its maps are made from, for a column document (None for maps): the page reads its
        # arrays where it asks something of every node (`app.view.step_fields.node_fields`)
        self.columns = columns


def indexed(wire: WireStep) -> WireStep:
    """`wire` with its index: itself when it has one, else an `IndexedWire` of its fields with the index made
    from its maps (one pass over the nodes, for a caller that reads the index many times)."""
    if isinstance(wire, IndexedWire):
        return cast(WireStep, wire)
    return cast(WireStep, IndexedWire(wire, index_from_wire(wire)))
