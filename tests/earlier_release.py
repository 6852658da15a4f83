"""What the releases before this one wrote of a step, written here for the tests that read it: the step's maps
(the wire form), sent by their tracers and stored in their files (`pack_step`, with spans), where this release
writes its column document. gradscape reads these forms and writes none of them (NOTE [Maps of earlier
releases] in tracer/wire/earlier/__init__.py); the tests also use the maps to compare two steps field by field
(`step_to_wire`: every node, tensor and field as plain data).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import msgpack
import numpy as np

from gradscape.tracer._model import NodeTrace, StepTrace
from gradscape.tracer.blobs import compress
from gradscape.tracer.collector import collector_paused
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire import pack
from gradscape.tracer.wire.codec import TensorTable, step_fields
from gradscape.tracer.wire.compact import ThumbTable
from gradscape.tracer.wire.earlier.spans import LAZY_KEYS
from gradscape.tracer.wire.step_index import index_from_wire, index_to_wire
from gradscape.tracer.wire.types import TensorNumpy, WireNode, WireRun, WireStep

SUMMARY_KEYS = ("shape", "dtype", "stats", "view", "device")  # a stored tensor's map: its arrays apart


@collector_paused()
def step_to_wire(st: StepTrace) -> WireStep:
    """The step's maps, every tensor's arrays in its map (what an earlier tracer sent)."""
    return _to_wire(st, TensorTable())


@collector_paused()
def step_to_graph(st: StepTrace) -> tuple[WireStep, list[TensorNumpy]]:
    """The step's maps with its tensors' arrays apart, by position (what an earlier store kept)."""
    tab = TensorTable(apart=True)
    wire = _to_wire(st, tab)
    return wire, tab.arrays or []


def node_to_wire(n: NodeTrace, tab: TensorTable) -> WireNode:
    return {
        "id": n.id, "name": n.name, "kind": n.kind, "module": n.module, "param": n.param,
        "source": n.source, "schema": n.schema, "order": n.order,
        "labels": list(n.input_labels), "args": list(n.input_args),
        "in_shapes": [None if s is None else list(s) for s in n.input_shapes],
        "out_shapes": [None if s is None else list(s) for s in n.output_shapes],
        "out_dtypes": list(n.output_dtypes),
        "gi": tab.refs(n.grad_inputs), "go": tab.refs(n.grad_outputs), "t": n.time_us,
        "runs": [list(WireRun(r.pass_index, r.order, tab.refs_all(r.grad_outputs), tab.refs(r.grad_inputs),
                              r.time_us)) for r in n.runs],
    }


def _to_wire(st: StepTrace, tab: TensorTable) -> WireStep:
    nodes: list[WireNode] = [node_to_wire(n, tab) for n in st.nodes]
    rest = step_fields(st, tab)  # after the nodes: tensors are numbered as first met
    return cast(WireStep, {**rest, "nodes": nodes, "edges": [list(e) for e in st.edges], "tensors": tab.items})


def pack_step(graph: Mapping[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """`graph` as msgpack, its `nodes` and `tensors` last, and where their items are (the spans
    `tracer.wire.earlier.spans.read_lazily` reads): per key, the offset of its first item and every item's
    length (little-endian uint32)."""
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


@collector_paused()
def write_maps(store: TraceStore, wire: Mapping[str, Any]) -> None:
    """Store `wire` (maps, arrays in its tensors) as a release before columns stored a step: its maps without
    the arrays, nodes and tensors last with their spans, the index made from the maps, an arrays row per
    tensor."""
    thumbs = ThumbTable().keep_all([t.get("thumb") for t in wire["tensors"]])
    values = [t.get("values") for t in wire["tensors"]]
    graph = {**wire, "tensors": [{k: t[k] for k in SUMMARY_KEYS} for t in wire["tensors"]]}
    (doc, spans), index = pack_step(graph), index_from_wire(graph)
    row = compress(pack({"index": index_to_wire(index), "spans": spans}))
    tensors = [(i, compress(pack({"thumb": th, "values": v})))
               for i, (th, v) in enumerate(zip(thumbs, values)) if th is not None or v is not None]
    store.write_rows(graph, (compress(doc), row, index.n_nodes, len(graph["edges"])), tensors)


def store_maps(store: TraceStore, st: StepTrace) -> None:
    """`write_maps` of the step's maps."""
    write_maps(store, step_to_wire(st))
