"""Tensor summaries by name or by place, each made a `TensorTrace` from its row of a step's tensor table when
first read.

NOTE [Traces made when read]
    A traced step's `st.params` and each `OptimizerStep.grads` hold, for each parameter, the summary of the gradient
    an optimizer stepped with (or a clip left, or the backward left where neither ran, the monitor or not): a row of
    the native recorder's tensor table (`TensorTable`, made at `NativeStep.assemble`); so does
    `BackwardPass.root_grads`, each backward call's root gradients. Making each row a `TensorTrace` (its statistics
    as a dictionary, its thumbnail widened from bfloat16) at the step's end cost every traced step of a small loop 8
    to 16 of them (forward-forward: 12 summaries of what its four optimizer steps used, 4 roots), for a step nobody
    may read: the memory sink only keeps it, and a sink that writes it reads every entry then. `TableTraces` (a
    mapping) and `TableList` (a list) keep the rows and make each `TensorTrace` once, when it is first read, by the
    table's `get`, which every reader of the row shares (`st.params[name]` and the optimizer step's entry are the
    same object). Each compares equal to the dictionary or list it stands for. The thumbnail budget, applied before
    the monitor fills these in (`Monitor._fill_trace`), reaches their rows through the table
    (`TensorTable.drop_thumbs`). The problem finder reads the layer norms of the rows `st.params` holds from the
    extension's `resolve_params` (`ParamGradients.held`), not from their `TensorTrace`s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping, MutableSequence
from typing import Any, overload

from gradscape.tracer._model import TensorTrace


class TableTraces(MutableMapping[str, TensorTrace]):
    """Name → `TensorTrace`; an entry held as an int is row `k` of `table`, made when read (NOTE [Traces made when
    read])."""

    __slots__ = ("_entries", "_table")

    def __init__(self, table: Any, entries: Mapping[str, TensorTrace | int]) -> None:
        self._table = table  # the step's `TensorTable` (None: every entry is a `TensorTrace` already)
        self._entries: dict[str, TensorTrace | int] = dict(entries)

    def __getitem__(self, name: str) -> TensorTrace:
        v = self._entries[name]
        if isinstance(v, int):
            v = self._entries[name] = self._table.get(v)
        return v

    def __setitem__(self, name: str, trace: TensorTrace) -> None:
        self._entries[name] = trace

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __repr__(self) -> str:
        return repr(dict(self.items()))


def held_entries(traces: Mapping[str, TensorTrace]) -> Mapping[str, TensorTrace | int]:
    """`traces` as held: a `TableTraces`' rows still as ints (no `TensorTrace` made), any other mapping as it is."""
    return traces._entries if isinstance(traces, TableTraces) else traces


class TableList(MutableSequence[TensorTrace | None]):
    """A list of `TensorTrace`s (or None); an item held as an int is row `k` of `table`, made when read (NOTE [Traces
    made when read]). It compares equal to the list it stands for."""

    __slots__ = ("_items", "_table")

    def __init__(self, table: Any, items: Iterable[TensorTrace | int | None]) -> None:
        self._table = table
        self._items: list[TensorTrace | int | None] = list(items)

    def add_row(self, row: int | None) -> None:
        """Row `row` of the table last (None: no gradient)."""
        self._items.append(row)

    def _made(self, k: int) -> TensorTrace | None:
        v = self._items[k]
        if isinstance(v, int):
            v = self._items[k] = self._table.get(v)
        return v

    @overload
    def __getitem__(self, k: int) -> TensorTrace | None: ...

    @overload
    def __getitem__(self, k: slice) -> list[TensorTrace | None]: ...

    def __getitem__(self, k: int | slice) -> TensorTrace | None | list[TensorTrace | None]:
        if isinstance(k, slice):
            return [self._made(i) for i in range(*k.indices(len(self._items)))]
        return self._made(k)

    def __setitem__(self, k: Any, v: Any) -> None:
        self._items[k] = v

    def __delitem__(self, k: int | slice) -> None:
        del self._items[k]

    def __len__(self) -> int:
        return len(self._items)

    def insert(self, k: int, v: TensorTrace | None) -> None:
        self._items.insert(k, v)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, TableList)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a list's equality, and like a list, not hashable

    def __repr__(self) -> str:
        return repr(list(self))
