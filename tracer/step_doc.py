"""A step's document in the trace file (the `graph` blob of its `steps` row) and its index row: written from
the step's wire fields, read back whole or lazily.

One form is written: the step's fields with `columns` in place of its nodes, edges and tensors (NOTE [Column
document] in tracer/wire/columns.py), and its index made from the columns. A step the columns cannot hold
(one built by hand with fields that disagree) is refused (NOTE [Columns of any step] in
tracer/wire/trace_columns.py). Files of earlier releases may also hold a step's maps, nodes and tensors last,
item by item; they are read as they are (NOTE [Maps of earlier releases] in tracer/wire/earlier/__init__.py).
Both read back as the same wire form: whole (`read_whole`), or with the node and tensor maps made when read
(`read_indexed`). A step in memory is drawn from that same form (`page_form`: `st.to_html()`, the notebook's
display).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from gradscape.tracer._model import StepTrace
from gradscape.tracer.blobs import compress, decompress
from gradscape.tracer.collector import collector_paused
from gradscape.tracer.wire import encode_array, pack, unpack
from gradscape.tracer.wire.column_index import index_from_columns
from gradscape.tracer.wire.column_read import step_from_columns
from gradscape.tracer.wire.column_write import step_columns
from gradscape.tracer.wire.columns import StepColumns
from gradscape.tracer.wire.earlier.maps_step import step_from_wire
from gradscape.tracer.wire.earlier.spans import read_lazily
from gradscape.tracer.wire.lazy import IndexedWire, LazyItems
from gradscape.tracer.wire.step_index import StepIndex, index_to_wire
from gradscape.tracer.wire.types import TensorArrays, TensorNumpy, TraceFormatError, WireStep
from gradscape.tracer.wire.versions import with_defaults


def encode(graph: Mapping[str, Any]) -> tuple[bytes, bytes, int, int]:
    """The step's column document and index row (both compressed), its node count and edge count."""
    cols = StepColumns(graph["columns"])
    doc, index = pack(graph), index_from_columns(cols)
    row = compress(pack({"index": index_to_wire(index), "spans": {}}))
    return compress(doc), row, index.n_nodes, int((cols.a["child_id"] >= 0).sum())


def _expanded(doc: dict[str, Any], lazily: bool, index: StepIndex | None = None) -> WireStep:
    """A column document's fields with its nodes, edges, tensors and execution order, which it does not
    store (the order is its runs'), and its columns (`IndexedWire.columns`); its maps made when read (`lazily`)
    or all now; its index `index` (the stored one), else made from the columns."""
    cols = StepColumns(doc.pop("columns"))
    wire = with_defaults(doc)  # before the items: a column document's nodes and tensors have every field
    doc.update(edges=cols.edges(), execution=cols.execution())
    if lazily:
        doc.update(nodes=LazyItems(cols.n_nodes, cols.node, cols.nodes),
                   tensors=LazyItems(cols.n_tensors, cols.tensor, cols.tensors))
    else:
        doc.update(nodes=cols.nodes(), tensors=cols.tensors())
    if index is not None and index.n_nodes != cols.n_nodes:
        raise TraceFormatError("the step's index is not of its columns")
    # the page's index from the columns, with numpy, not by a pass over the maps (`indexed`)
    return cast(WireStep, IndexedWire(wire, index if index is not None else index_from_columns(cols), cols))


def read_whole(blob: bytes) -> WireStep:
    """The stored step's wire form, every map made; a column document's with its index (`IndexedWire`)."""
    doc = read_doc(blob)
    return _expanded(doc, lazily=False) if "columns" in doc else with_defaults(doc)


def read_doc(blob: bytes) -> dict[str, Any]:
    """The stored step's document, unpacked (`read_trace` reads it)."""
    doc = unpack(decompress(blob))
    if not isinstance(doc, dict):
        raise TraceFormatError("the step's document is not a map")
    return doc


def read_trace(doc: dict[str, Any], arrays: dict[int, TensorNumpy]) -> StepTrace:
    """The stored step (`read_doc`) as a `StepTrace`, its tensors' (thumbnail, values) from `arrays`: a column
    document's tensors made from its columns (NOTE [Column read] in tracer/wire/column_read.py) and its nodes
    its tables (NOTE [Read back as tables] in tracer/record/column_tables.py), a map document's from its maps."""
    if "columns" in doc:
        from gradscape.tracer.record.column_tables import column_nodes  # (the recorder's modules import torch)

        return step_from_columns(doc, arrays, column_nodes)
    return step_from_wire(with_defaults(doc), arrays)


def read_indexed(blob: bytes, index: StepIndex, spans: Any) -> WireStep:
    """The stored step with its index: its node and tensor maps made when read."""
    raw = decompress(blob)
    if spans:
        return cast(WireStep, IndexedWire(with_defaults(read_lazily(raw, spans)), index))
    doc = unpack(raw)
    if not isinstance(doc, dict) or "columns" not in doc:
        raise TraceFormatError("a step stored without spans has no columns")
    return _expanded(doc, lazily=True, index=index)


@collector_paused()  # NOTE [Collector paused] in tracer/collector.py
def page_form(st: StepTrace, arrays: bool = True) -> tuple[WireStep, dict[int, TensorArrays]]:
    """A step in memory as the page reads a stored one (`read_whole`, `TraceStore.read_arrays`): its column
    document, packed and read back as the store keeps it, with every map made, and each tensor's arrays by
    number (none when not `arrays`). So `st.to_html()` and the notebook's display draw what a live page draws
    of the same step, from the same form (NOTE [Column document] in tracer/wire/columns.py). A step the
    columns cannot hold (one built by hand: NOTE [Columns of any step] in tracer/wire/trace_columns.py)
    raises `TraceFormatError`, as storing it does."""
    doc, numpy = step_columns(st)
    wire = _expanded(read_doc(pack(doc)), lazily=False)
    if not arrays:
        return wire, {}
    return wire, {i: {"thumb": None if th is None else encode_array(th), "values": None if v is None else
                      encode_array(v)} for i, (th, v) in enumerate(numpy)}
