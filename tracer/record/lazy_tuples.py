"""A list of int tuples kept as columns until someone reads it: `StepTrace.execution` and `StepTrace.edges` of a
natively recorded step.

NOTE [Lazy columns]
    The trace file and the wire take a natively recorded step's execution order and edges from its columns
    (NOTE [Column document] in tracer/wire/columns.py), so a step nobody reads them of needs no Python tuple for
    each run or edge: a 100k-node step's execution list took 8 ms and 9 MiB a kept step, and its edges, kept
    as tuples once per graph structure, 20 MiB. `LazyTuples` holds the columns (numpy arrays) and makes the
    list of tuples when first read, then drops the columns; it compares equal to a list of the same tuples.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np


class LazyTuples(Sequence[tuple[int, ...]]):
    """The tuples `zip(*columns)` (as Python ints), made into a list when first read."""

    __slots__ = ("_cols", "_n", "_list")

    def __init__(self, *columns: np.ndarray) -> None:
        self._cols: tuple[np.ndarray, ...] | None = columns
        self._n = len(columns[0])
        self._list: list[tuple[int, ...]] | None = None

    def _items(self) -> list[tuple[int, ...]]:
        if self._list is None:
            assert self._cols is not None
            self._list = list(zip(*(c.tolist() for c in self._cols)))
            self._cols = None
        return self._list

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> tuple[int, ...]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, ...]]: ...

    def __getitem__(self, i: int | slice) -> tuple[int, ...] | list[tuple[int, ...]]:
        return self._items()[i]

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return iter(self._items())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, (str, bytes)) and self._items() == list(other)

    __hash__ = None  # type: ignore[assignment]  # a list's equality, and like a list, not hashable

    def __repr__(self) -> str:
        return repr(self._items())

    def columns(self) -> tuple[Any, ...] | None:
        """The columns, while the list is not made (None after)."""
        return self._cols
