"""A step as columns (NOTE [Column document] in columns.py), asked of the step itself: the store writes
it (`column_parts`) and the socket sink sends it (`step_message`).

A recorded step's nodes (`LazyNodes`, tracer/record/tables.py: either recorder's, or a step read back from
columns) write its columns from its tables (`LazyNodes.column_parts`, from tracer/record/wire_columns.py). The
store and the sinks are a layer above the recorder and import none of it (docs/architecture.md): they ask the
step's nodes. A step whose nodes are a list (read from an earlier release's maps, built by hand) is written
from its `NodeTrace`s (`trace_columns`, NOTE [Columns of any step]), or refused with `TraceFormatError`: every
step is stored and sent as columns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscape.tracer.wire import trace_columns
from gradscape.tracer.wire.arrays import encode_array
from gradscape.tracer.wire.types import TensorNumpy

# shape -> (positions ascending, the (n, *shape) stack of the kernel's thumbnails of that shape)
Stacks = dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]]


def column_parts(st: Any) -> tuple[dict[str, Any], list[TensorNumpy], Stacks]:
    """The step's document fields with `columns` in place of `nodes`, `edges` and `tensors`, every tensor's
    (thumbnail, values) by position but the kernel's thumbnails, which come stacked by shape (NOTE [Thumbnail
    stacks] in tracer/record/thumb_stacks.py). `TraceFormatError` for a step the columns cannot hold (NOTE
    [Columns of any step] in trace_columns.py)."""
    own = getattr(st.nodes, "column_parts", None)
    return trace_columns.column_parts(st) if own is None else own(st)  # type: ignore[no-any-return]


def step_columns(st: Any) -> tuple[dict[str, Any], list[TensorNumpy]]:
    """`column_parts` with every thumbnail in its tensor's place."""
    doc, arrays, stacks = column_parts(st)
    for at, stack in stacks.values():
        for i, p in enumerate(at.tolist()):
            arrays[p] = (stack[i], None)
    return doc, arrays


def step_message(st: Any) -> dict[str, Any]:
    """What the socket sink sends of a step: its document (`step_columns`) with each tensor's `[thumb, values]`
    as wire arrays (`tracer.wire.column_check` reads it)."""
    doc, arrays = step_columns(st)
    return {**doc, "arrays": [[None if th is None else encode_array(th), None if v is None else encode_array(v)]
                              for th, v in arrays]}
