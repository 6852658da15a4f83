"""The find box read from a column document's arrays (`node_fields`, `SearchTable`): the same options, hits
and answers as from the node maps, for every zoo model, the LSTMCell loop and a NaN step; no node's map made
for them but the parameters'; and the page's data making a step's table once for its options and every query."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from earlier_release import step_to_wire
from zoo import ZOO, build

import gradscape
from gradscape.app.data import PageData
from gradscape.app.view import SEARCH_ALL, SEARCH_HITS, SearchTable, find, search, search_index
from gradscape.app.view.step_fields import node_fields
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire.lazy import LazyItems

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from workloads import lstm_loop  # noqa: E402

QUERIES = ["weight", "Addmm", "AddmmBackward0", "accumulate", "relu", "n3", "7", "fc1", "fc2.weight", "<root>",
           "sigmoid", "cell", "no such thing", "  ", "MUL"]


def _traced(name: str, nodes: int = 300) -> gradscape.StepTrace:
    if name == "lstm":
        wl = lstm_loop(nodes)
        model, run = wl.model, lambda: wl.loss(wl.model, wl.batch()).backward()
    elif name == "nan":
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        x = torch.randn(5, 3)
        run = lambda: model(x).sqrt().sum().backward()  # noqa: E731 (a NaN where an output is negative)
    else:
        case = build(name)
        model, run = case.model, lambda: case.loss(case.model, case.batch).backward()
    with gradscape.Tracer(model, tensors="summary").step(0) as st:
        run()
    assert st is not None
    return st


def _stored(st: gradscape.StepTrace, path: Path) -> Any:
    """The step as the page reads it: stored, then read lazily with its columns (`read_indexed`)."""
    with TraceStore(path) as store:
        store.write_step(st)
        return store.read_indexed(st.run, st.step)


@pytest.mark.parametrize("name", [*ZOO, "lstm", "nan"])
def test_the_columns_give_what_the_maps_give(name: str, tmp_path: Path) -> None:
    st = _traced(name)
    maps = step_to_wire(st)  # a step's node maps, as an earlier release stored them: no columns
    cols = _stored(st, tmp_path / "t.sqlite")
    assert getattr(cols, "columns", None) is not None and getattr(maps, "columns", None) is None
    a, b = node_fields(cols), node_fields(maps)
    assert (a.names, a.modules, a.params) == (b.names, b.modules, b.params)
    assert np.array_equal(a.orders, b.orders)
    nodes = maps["nodes"]  # and what each node's own map says
    assert a.names == [n["name"] for n in nodes] and a.modules == [n["module"] for n in nodes]
    assert a.params == {n["id"]: n["param"] for n in nodes if n["param"]}
    assert a.orders.tolist() == [-1 if n["order"] is None else n["order"] for n in nodes]
    assert search_index(cols) == search_index(maps)
    table = SearchTable(cols)
    assert table.options() == SearchTable(maps).options()
    for q in QUERIES:
        assert search(cols, q) == search(maps, q), q
        assert find(cols, q) == find(maps, q), q
        assert table.search(q) == search(maps, q), q  # a table asked again gives the same


def _made(wire: Any) -> int:
    items = wire["nodes"]
    assert isinstance(items, LazyItems)
    return sum(item is not None for item in items._items)


def test_a_big_step_searched_makes_no_node_map_but_its_parameters(tmp_path: Path) -> None:
    st = _traced("lstm", SEARCH_ALL + 500)
    assert len(st.nodes) > SEARCH_ALL
    wire = _stored(st, tmp_path / "t.sqlite")
    n_params = len(node_fields(wire).params)
    assert n_params < 10
    table = SearchTable(wire)
    first = table.index()
    hits = table.search("sigmoid", limit=SEARCH_HITS)
    assert table.find("SigmoidBackward0") is not None
    assert _made(wire) <= n_params  # the parameters' nodes, for their labels
    assert len(hits) == SEARCH_HITS and all("sigmoid" in h["label"].lower() for h in hits)
    assert len(first) == SEARCH_HITS and first == search_index(step_to_wire(st))  # as the maps give them
    ran = sorted((n for n in step_to_wire(st)["nodes"] if n["order"] is not None), key=lambda n: n["order"])
    want = [f"n{n['id']}" for n in ran if n["name"] == "SigmoidBackward0"][:SEARCH_HITS]
    assert [h["value"] for h in hits] == want  # in the order backward ran them
    assert first[0]["value"].startswith("m:")


def _page_data(st: gradscape.StepTrace, path: Path) -> Iterator[tuple[TraceStore, PageData]]:
    """The step written to a trace file, then that file opened as the page's server opens it."""
    with TraceStore(path) as store:
        store.write_step(st)
    with TraceStore(path) as store:
        yield store, PageData(store)


def test_the_page_data_makes_a_step_table_once(tmp_path: Path) -> None:
    st = _traced("lstm")
    for store, data in _page_data(st, tmp_path / "t.sqlite"):
        table = data.search_table(st.run, st.step)
        assert data.search_table(st.run, st.step) is table
        assert data.search_index(st.run, st.step) == table.index() == search_index(data.graph(st.run, st.step))
        wire = store.read_indexed(st.run, st.step)
        gone = weakref.ref(wire)
        kept = SearchTable(wire)
        del wire
        gc.collect()
        assert gone() is None and kept.find("SigmoidBackward0") is not None  # a table kept keeps no step


def test_the_page_makes_maps_only_for_the_nodes_it_draws(tmp_path: Path) -> None:
    """A big step opened folded, searched, and its cell opened into its calls: the page reads every node's name,
    module, order, statistics and slot labels from the columns and the index; a node's map is made only for a
    node drawn or a parameter (its label in the find box)."""
    from gradscape.app.ui.graph import graph_payload

    st = _traced("lstm", SEARCH_ALL + 500)
    for _store, data in _page_data(st, tmp_path / "t.sqlite"):
        wire = data.graph(st.run, st.step)
        n_params = len(node_fields(wire).params)
        elements, *_, options = graph_payload(data, st.run, st.step, "norm", None)
        drawn = sum("source" not in e["data"] for e in elements)  # nodes and module boxes, not edges
        assert len(options) == SEARCH_HITS and _made(wire) <= drawn + n_params < len(st.nodes) // 100
        data.search_table(st.run, st.step).search("tanh", limit=SEARCH_HITS)
        assert _made(wire) <= drawn + n_params
        folded = data.layout(st.run, st.step, None)["collapsed"]
        assert "cell" in folded
        opened = {"run": st.run, "collapsed": [m for m in folded if m != "cell"]}
        elements, *_ = graph_payload(data, st.run, st.step, "norm", opened)
        drawn_now = sum("source" not in e["data"] for e in elements)
        assert drawn_now > drawn
        assert _made(wire) <= drawn + drawn_now + n_params < len(st.nodes) // 20
