"""One step form (NOTE [Python steps as tables] in tracer/record/assemble.py, NOTE [Read back as tables] in
tracer/record/column_tables.py): a step the Python recorder made and a step read back from a trace file are the
native recorder's tables, their nodes made when read, and their columns written from those tables. What the
tables give is checked against the step's nodes read one by one (the readers' generic path) and against
torch's own gradients."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from earlier_release import step_to_graph
from zoo import ZOO, build, loop_model, loop_step

import gradscape
from gradscape.tracer.record import native
from gradscape.tracer.record.debug.step_checks import _relu_zeros
from gradscape.tracer.record.tables import LazyNodes
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire import pack, trace_columns
from gradscape.tracer.wire.column_write import step_columns
from gradscape.tracer.wire.columns import StepColumns

RECORDERS = ["python", pytest.param("native", marks=pytest.mark.skipif(not native.status()[0],
                                                                       reason="the native recorder is not built"))]


def _zoo_step(name: str, recorder: str, **opts: Any) -> Any:
    case = build(name)
    with gradscape.Tracer(case.model, run="form", recorder=recorder, **opts) as tr, tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    assert st.meta["recorder"] == recorder
    return st


def _no_node_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing a step from its `NodeTrace`s fails the test (gradscape writes no maps: NOTE [Maps of earlier
    releases])."""
    monkeypatch.setattr(trace_columns, "column_parts", lambda st: pytest.fail("columns written from NodeTraces"))


@pytest.mark.parametrize("name", ZOO)
def test_a_python_recorded_step_is_the_native_recorders_tables(name: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Its nodes are a `LazyNodes` over `StepTables`; it is stored from its tables (no `NodeTrace` is made or
    written), and reads back as it was written."""
    st = _zoo_step(name, "python")
    assert isinstance(st.nodes, LazyNodes)
    made = st.nodes._made
    with monkeypatch.context() as m:
        _no_node_writer(m)
        with TraceStore(tmp_path / "t.sqlite") as store:
            store.write_step(st)
    assert all(n is None for n in made), "storing the step made NodeTraces"
    back = gradscape.load(tmp_path / "t.sqlite")
    assert pack(step_to_graph(back)[0]) == pack(step_to_graph(st)[0])


@pytest.mark.parametrize("name", ZOO)
def test_the_two_recorders_tables_write_the_same_columns(name: str) -> None:
    """The same step recorded by each recorder: column documents that read back to the same nodes and tensors
    (their code tables may list dtypes and plans in another order), but for the times the runs took."""
    if not native.status()[0]:
        pytest.skip("the native recorder is not built")
    read = []
    for recorder in ("python", "native"):
        made = step_columns(_zoo_step(name, recorder))
        assert made is not None
        cols = StepColumns(made[0]["columns"])
        nodes = cols.nodes()
        for n in nodes:
            n["t"] = None
            for run in n["runs"]:
                run[4] = None
        read.append(pack([nodes, cols.tensors(), cols.edges(), cols.execution()]))
    assert read[0] == read[1]


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_step_read_back_is_tables_and_writes_the_same_document(recorder: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded from its file, a step's nodes are tables again, and writing it to a second file writes the
    first file's document, byte for byte, from them."""
    tr = gradscape.Tracer(loop_model(), recorder=recorder, sink=str(tmp_path / "a.sqlite"), run="r")
    loop_step(tr, 0, 12)
    tr.close()
    back = gradscape.load(tmp_path / "a.sqlite")
    assert isinstance(back.nodes, LazyNodes)
    with monkeypatch.context() as m:
        _no_node_writer(m)
        with TraceStore(tmp_path / "b.sqlite") as store:
            store.write_step(back)
    docs = [TraceStore(tmp_path / f, readonly=True)._graph_blob("r", 0, 0) for f in ("a.sqlite", "b.sqlite")]
    assert docs[0] == docs[1]


@pytest.mark.parametrize("source", ["python", "read back"])
def test_the_tables_dead_unit_rows_are_the_nodes(source: str, tmp_path: Path) -> None:
    """The dead-unit check's ReLU rows read from the tables (`relu_slots`) equal those read node by node."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 1))
    with torch.no_grad():
        model[0].bias.fill_(-3.0)  # most units of the first ReLU inactive
    with gradscape.Tracer(model, recorder="python", sink=str(tmp_path / "t.sqlite"), run="r") as tr, \
            tr.step(0) as st:
        model(torch.randn(16, 6)).pow(2).mean().backward()
    if source == "read back":
        st = gradscape.load(tmp_path / "t.sqlite")
    tables = _relu_zeros(st.nodes)
    assert len(tables) == 2
    assert tables == _relu_zeros(list(st.nodes))
    assert any(p.kind == "dead" for p in st.problems)


def test_a_python_recorded_steps_gradients_are_torchs(tmp_path: Path) -> None:
    """Through the tables: each parameter's AccumulateGrad node got what `p.grad` holds, and the root's arrival
    is the seed; read back from the file, the same statistics."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    with gradscape.Tracer(model, recorder="python", sink=str(tmp_path / "t.sqlite"), run="r",
                          tensors="full") as tr, tr.step(0) as st:
        model(torch.randn(4, 5)).pow(2).sum().backward()
    back = gradscape.load(tmp_path / "t.sqlite")
    for name, p in model.named_parameters():
        for step in (st, back):
            node = step.param_node(name)
            assert node is not None and node.grad_outputs is not None
            got = node.grad_outputs[0]
            assert got is not None and got.values is not None
            assert torch.equal(torch.tensor(got.values), p.grad), name
            assert got.stats["norm"] == pytest.approx(float(p.grad.norm()), rel=1e-6)


@pytest.mark.parametrize("name", ZOO)
def test_a_step_written_from_its_node_list_is_the_document_its_tables_write(name: str, tmp_path: Path) -> None:
    """The column document has one writer (tracer/wire/column_doc.py): a Python-recorded step's nodes as a list of
    `NodeTrace`s (as a step read from an earlier release's maps, or built by hand, holds them) write the bytes
    its tables write, and the list is stored and read back as the step."""
    st = _zoo_step(name, "python")
    listed = dataclasses.replace(st, nodes=list(st.nodes))
    assert not isinstance(listed.nodes, LazyNodes)
    (doc, arrays), (doc_listed, arrays_listed) = step_columns(st), step_columns(listed)
    assert pack(doc_listed) == pack(doc)
    assert [tuple(map(id, a)) for a in arrays_listed] == [tuple(map(id, a)) for a in arrays]  # the same pictures
    with TraceStore(tmp_path / "t.sqlite") as store:
        store.write_step(listed)
    back = gradscape.load(tmp_path / "t.sqlite")
    assert pack(step_to_graph(back)[0]) == pack(step_to_graph(st)[0])


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_steps_nodes_are_read_only(recorder: str) -> None:
    """A node made from the tables cannot be changed in place, which would show one thing and store another
    (NOTE [Read-only steps]); a changed copy is made with `dataclasses.replace`."""
    st = _zoo_step("mlp", recorder)
    node = st.nodes[0]
    with pytest.raises(dataclasses.FrozenInstanceError, match="source"):
        node.source = "elsewhere.py:1"  # type: ignore[misc]
    changed = dataclasses.replace(st, nodes=[dataclasses.replace(n, source="elsewhere.py:1") for n in st.nodes])
    cols = StepColumns(step_columns(changed)[0]["columns"])
    assert {n["source"] for n in cols.nodes()} == {"elsewhere.py:1"}
    assert st.nodes[0].source != "elsewhere.py:1"
