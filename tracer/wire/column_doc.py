"""The column document's one writer (NOTE [Column document] in columns.py): whichever form a step's nodes are
in, its tables (tracer/record/wire_columns.py) or a list of `NodeTrace`s (trace_columns.py), what each gives
is coded (`codes`), its tensor plans ordered (`plan_codes`) and laid out as the document (`document`) here,
so a change to the document's layout is made once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gradscape.tracer.wire.columns import COLUMNS_VERSION, NODE_ARRAYS, NODE_TABLES, TENSOR_ARRAYS

TENSOR_TABLES = ("n", "plans", "maps")  # the tensor columns' fields before their arrays; `extra` comes last


def codes(values: list[Any], key: Any = None) -> tuple[list[Any], list[int]]:
    """The distinct `values` in the order met, and each value's position among them: compared as they are
    (hashable), or by `key(value)` when given (the table then holds the first value of each key)."""
    seen: dict[Any, int] = {}
    if key is None:
        code = [seen.setdefault(v, len(seen)) for v in values]
        return list(seen), code
    table: list[Any] = []
    code = []
    for v in values:
        c = seen.setdefault(key(v), len(table))
        if c == len(table):
            table.append(v)
        code.append(c)
    return table, code


def plan_key(shape: Any, dtype: str, view: str | None, device: str) -> tuple[Any, ...]:
    """A tensor plan (`[shape, dtype, view, device]`) as a key that sorts (no view before every view)."""
    return tuple(shape), dtype, view is None, view or "", device


def plan_codes(keys: list[tuple[Any, ...]]) -> tuple[list[list[Any]], list[int]]:
    """The plans of `keys` (`plan_key`s), sorted, so a step's table is the same whichever writer or recorder
    made it and whether it was read back (tests/test_step_form.py), and each key's position among them."""
    table = sorted(set(keys))
    at = {k: c for c, k in enumerate(table)}
    plans = [[list(shape), dtype, None if no_view else view, device] for shape, dtype, no_view, view, device in table]
    return plans, [at[k] for k in keys]


def document(fields: dict[str, Any], nodes: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` (the step's other fields) with `columns` in place of `nodes`, `edges` and `tensors`: `nodes`
    gives the node tables (`NODE_TABLES`) and arrays (`NODE_ARRAYS`), `tensors` the tensor tables
    (`TENSOR_TABLES`), arrays (`TENSOR_ARRAYS`) and `extra`; an array is anything numpy takes, written as
    little-endian bytes of its column's type."""
    node_cols = {k: nodes[k] for k in NODE_TABLES}
    node_cols.update((k, np.ascontiguousarray(nodes[k], dt).tobytes()) for k, dt in NODE_ARRAYS.items())
    tensor_cols = {k: tensors[k] for k in TENSOR_TABLES}
    tensor_cols.update((k, np.ascontiguousarray(tensors[k], dt).tobytes()) for k, dt in TENSOR_ARRAYS.items())
    tensor_cols["extra"] = tensors["extra"]
    return {**fields, "columns": {"version": COLUMNS_VERSION, "nodes": node_cols, "tensors": tensor_cols}}
