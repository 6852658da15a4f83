"""A natively recorded step's nodes go to the wire from its tables (NOTE [Nodes to the wire] in
tracer/record/wire_nodes.py): the bytes are those of the same step written from materialised `NodeTrace`s,
for every program the native recorder is tested on, with some nodes already made, with thumbnails left out
by the budget, and with the arrays kept apart as the trace file keeps them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from test_native_recorder import PROGRAMS, _program
from zoo import loop_model, loop_step

import gradscape
from gradscape.tracer._model import STAT_NAMES
from gradscape.tracer.record.tables import LazyNodes
from gradscape.tracer.summary.stats import stats_from_raw
from gradscape.tracer.wire.codec import pack, step_to_graph, step_to_wire


def _traced(name: str, **options: Any) -> Any:
    model, loss_of = _program(name)
    tr = gradscape.Tracer(model, **options)
    with tr.step(0) as st:
        loss_of(model).backward()
    assert st.meta.get("recorder") == "native", st.meta
    return st


def _made(st: Any) -> int:
    return sum(n is not None for n in st.nodes._made)


def _from_objects(st: Any) -> bytes:
    """The wire bytes written from every node's `NodeTrace` (the codec's path for any other step)."""
    list(st.nodes)  # every node made
    return pack(step_to_wire(st))


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_wire_from_the_tables_is_the_wire_from_the_nodes(name: str) -> None:
    st = _traced(name)
    assert isinstance(st.nodes, LazyNodes)
    before = _made(st)
    fast = pack(step_to_wire(st))
    assert _made(st) == before, "writing the step made NodeTraces"
    assert fast == _from_objects(st)


def test_nodes_already_made_keep_their_place_and_their_tensors() -> None:
    """Some nodes made (a reader looked at them) and the rest from the tables: one wire index per gradient,
    and the same bytes."""
    tr = gradscape.Tracer(loop_model())
    st = loop_step(tr, 0, 6)
    for k in range(0, len(st.nodes), 3):
        st.nodes[k]
    fast = pack(step_to_wire(st))
    assert fast == _from_objects(st)


def test_the_thumbnail_budget_is_written_as_it_cut() -> None:
    tr = gradscape.Tracer(loop_model(), thumb_budget=2_000)
    st = loop_step(tr, 0, 12)
    assert st.meta["thumbs_left_out"]["count"] > 20
    wire = step_to_wire(st)
    assert sum(t["thumb"] is None for t in wire["tensors"]) >= st.meta["thumbs_left_out"]["count"]
    assert pack(wire) == _from_objects(st)


def test_the_arrays_kept_apart_are_the_nodes_arrays() -> None:
    """The trace file's form (`step_to_graph`): the same graph and the same arrays, bit for bit."""
    torch.manual_seed(0)
    tr = gradscape.Tracer(loop_model())
    st = loop_step(tr, 0, 5)
    graph, arrays = step_to_graph(st)
    list(st.nodes)
    graph2, arrays2 = step_to_graph(st)
    assert pack(graph) == pack(graph2)
    assert len(arrays) == len(arrays2) == len(graph["tensors"])
    for (a, v), (b, w) in zip(arrays, arrays2):
        assert v is None and w is None
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_statistics_from_the_table_match_each_row_made_alone() -> None:
    """`TensorTable.stats_rows` against `stats_from_raw`, row by row, on rows with nothing finite, NaN and
    Inf counts, a single element and zero sums."""
    st = _traced("lstm")
    table = st.nodes.tables.tensors
    raw = np.array([[np.nan, np.nan, 0.0, 0.0, 0.0, 3.0, 1.0, 0.0],   # nothing finite
                    [2.0, 2.0, 2.0, 4.0, 1.0, 0.0, 0.0, 1.0],          # one element
                    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0],          # all zeros
                    [-1e300, 1e300, 1e300, np.inf, 4.0, 0.0, 2.0, 4.0],  # a sum of squares past float64
                    [-3.0, 5.0, 1.5, 40.0, 3.0, 1.0, 0.0, 3.0]])
    table.raw = np.concatenate([table.raw, raw])
    rows = table.stats_rows()
    for k in range(len(table.raw)):
        one = stats_from_raw(tuple(table.raw[k].tolist()))
        want = [float(one[s]) for s in STAT_NAMES]
        assert np.array(rows[k]).tobytes() == np.array(want).tobytes(), (k, rows[k], want)


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_parameters_node_is_found_without_making_the_others(name: str) -> None:
    """`StepTrace.param_node` reads the parameter column (the monitor asks it of a spiking layer every such
    step): the node the plain search over every node finds, and no other node made."""
    st = _traced(name)
    names = sorted({p for p in st.nodes.tables.params.values()})
    assert names, name
    got = {p: st.param_node(p) for p in names}
    assert _made(st) <= len(names)
    assert st.param_node("no.such.parameter") is None
    for p, node in got.items():
        assert node is not None and node is next(n for n in st.nodes if n.param == p), p
