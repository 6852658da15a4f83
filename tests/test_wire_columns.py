"""A step stored as columns (NOTE [Column document]), natively recorded or by the Python recorder (NOTE [Columns
of any step]), reads back as the same step as when stored as maps, the form earlier releases wrote: the same
`StepTrace`, the same document, its tensors numbered alike, the same index, the same maps read lazily and whole,
the same pictures; a step the columns cannot hold is stored as maps; a damaged column document is named."""

from __future__ import annotations

import dataclasses
import math
import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from earlier_release import step_to_wire, write_maps
from zoo import ZOO, build, loop_model, loop_step

import gradscape
from gradscape.tracer.blobs import compress, decompress
from gradscape.tracer.record import native
from gradscape.tracer.sinks.file import FileSink
from gradscape.tracer.store import StoreError, TraceStore
from gradscape.tracer.wire import TraceFormatError, pack, unpack
from gradscape.tracer.wire.lazy import LazyItems
from gradscape.tracer.wire.step_index import index_from_wire

RECORDERS = [pytest.param("native", marks=pytest.mark.skipif(not native.status()[0], reason="no native recorder")),
             "python"]


def _steps(name: str, recorder: str = "native") -> list[Any]:
    """Two traced steps of case `name` (memory sink) by `recorder`, the second on a warm structure cache."""
    if recorder == "native" and not native.status()[0]:
        pytest.skip("the native recorder is not built")
    if name == "loop":
        torch.manual_seed(0)
        with gradscape.Tracer(loop_model(), run=name, every=1, recorder=recorder) as tr:
            return [loop_step(tr, i, 40) for i in range(2)]
    if name == "nan":  # NaN and Inf gradients: badges
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
        with gradscape.Tracer(model, run=name, recorder=recorder) as tr, tr.step(0) as st:
            (model(torch.randn(2, 3)).sqrt() * torch.tensor([[math.inf], [1.0]])).sum().backward()
        return [st]
    if name in ("two_passes", "error"):  # a node run twice (retain_graph); a step that raised after its backward
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        with gradscape.Tracer(model, run=name, recorder=recorder) as tr:
            try:
                with tr.step(0) as st:
                    y = model(torch.randn(5, 3))
                    y.sum().backward(retain_graph=True)
                    if name == "error":
                        raise RuntimeError("boom")
                    (y * y).sum().backward()
            except RuntimeError:
                pass
        assert (st.error is not None) == (name == "error") and len(st.passes) == (1 if name == "error" else 2)
        return [st]
    case = build(name)
    kwargs = {"thumb_budget": 300} if name == "cnn" else {}  # the budget leaves thumbnails out
    out = []
    with gradscape.Tracer(case.model, run=name, recorder=recorder, **kwargs) as tr:
        for i in range(2):
            with tr.step(i) as st:
                case.loss(case.model, case.batch).backward()
            out.append(st)
    return out


def nodes_made(st: Any) -> Any:
    """The step with its nodes made (a plain list): written from its `NodeTrace`s (NOTE [Columns of any step]),
    as a step the Python recorder made is, not from the native recorder's tables (`LazyNodes.column_parts`)."""
    return dataclasses.replace(st, nodes=list(st.nodes))


def _store(path: Path, steps: list[Any], columns: bool) -> None:
    """Each step as this release stores it (columns), or in the maps form earlier releases stored (as the server
    stores a step sent as maps)."""
    with TraceStore(path) as store:
        for st in steps:
            if columns:
                store.write_step(st)
            else:
                write_maps(store, step_to_wire(st))


def _pictures(store: TraceStore, run: str, step: int) -> list[Any]:
    """Every node's slots' thumbnails, in node order."""
    graph = store.read_graph(run, step)
    arrays = store.read_arrays(run, step, range(len(graph["tensors"])))
    return [None if i is None else arrays.get(i, {}).get("thumb")
            for n in graph["nodes"] for i in (n["go"] or []) + (n["gi"] or [])]


@pytest.mark.parametrize("recorder", RECORDERS)
@pytest.mark.parametrize("name", [*ZOO, "loop", "nan", "two_passes", "error"])
def test_columns_read_back_as_the_maps(tmp_path: Path, name: str, recorder: str) -> None:
    steps = _steps(name, recorder)
    paths = {form: tmp_path / f"{form}.sqlite" for form in ("columns", "maps")}
    for form, path in paths.items():
        _store(path, steps, form == "columns")
    with sqlite3.connect(paths["columns"]) as db:
        docs = [unpack(decompress(blob)) for (blob,) in db.execute("SELECT graph FROM steps")]
    assert docs and all("columns" in d and "nodes" not in d for d in docs)
    with TraceStore(paths["columns"], readonly=True) as a, TraceStore(paths["maps"], readonly=True) as b:
        for st in steps:
            run, i = st.run, st.step
            assert pack(step_to_wire(a.read_step(run, i))) == pack(step_to_wire(b.read_step(run, i)))  # NaN too
            # the same document, tensors numbered alike (the fields in another order)
            assert pack(sorted(a.read_graph(run, i).items())) == pack(sorted(b.read_graph(run, i).items()))
            whole, lazy = a.read_graph(run, i), a.read_indexed(run, i)
            assert isinstance(lazy["nodes"], LazyItems)
            assert lazy["nodes"][len(whole["nodes"]) // 2] == whole["nodes"][len(whole["nodes"]) // 2]
            assert pack(lazy["tensors"][-1]) == pack(whole["tensors"][-1])
            assert pack({**lazy, "nodes": list(lazy["nodes"]), "tensors": list(lazy["tensors"])}) == pack(whole)
            ia, ib, iw = lazy.index, b.read_indexed(run, i).index, index_from_wire(whole)  # type: ignore[attr-defined]
            ic = whole.index  # type: ignore[attr-defined]  # read whole: the index made from its columns
            for f in ("n_nodes", "modules", "module_code", "names", "name_code", "badges", "accumulated",
                      "param_node"):
                assert getattr(ia, f) == getattr(ib, f) == getattr(iw, f) == getattr(ic, f), f
            assert all(np.array_equal(np.array(v, float), np.array(ic.values[c], float), equal_nan=True)
                       for c, v in iw.values.items())
            for c, values in ia.values.items():
                assert np.array_equal(np.array(values, float), np.array(ib.values[c], float), equal_nan=True), c
            assert np.array_equal(ia.sent, ib.sent) and np.array_equal(ia.sent_start, ib.sent_start)
            assert _pictures(a, run, i) == _pictures(b, run, i)
            if name == "nan":
                assert ia.badges


def _special(kind: str) -> Any:
    """A step of one of the ways of training the zoo does not hold, recorded in Python."""
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    if kind == "sparse":
        model: Any = torch.nn.Embedding(10, 4, sparse=True)
        body = lambda: model(torch.tensor([1, 2, 3])).sum().backward()  # noqa: E731
    else:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        body = {"autograd_grad": lambda: torch.autograd.grad(model(x).sum(), list(model.parameters())),
                "checkpoint": lambda: torch.utils.checkpoint.checkpoint(
                    model, x.requires_grad_(), use_reentrant=False).sum().backward(),
                "gradient": lambda: model(x).backward(torch.full((3, 1), 2.0)),
                "two_roots": lambda: torch.autograd.backward([model(x).sum(), model(x).mean()]),
                "full": lambda: model(x).pow(2).sum().backward()}[kind]
    tensors = "full" if kind == "full" else "summary"
    with gradscape.Tracer(model, run=kind, recorder="python", tensors=tensors) as tr, tr.step(0) as st:
        body()
    return st


@pytest.mark.parametrize("kind", ["autograd_grad", "checkpoint", "gradient", "two_roots", "full", "sparse"])
def test_a_python_step_of_each_kind_is_stored_as_columns_that_read_back_as_its_maps(tmp_path: Path,
                                                                                   kind: str) -> None:
    st = _special(kind)
    paths = {form: tmp_path / f"{form}.sqlite" for form in ("columns", "maps")}
    for form, path in paths.items():
        _store(path, [st], form == "columns")
    with sqlite3.connect(paths["columns"]) as db:
        assert "columns" in unpack(decompress(db.execute("SELECT graph FROM steps").fetchone()[0]))
    with TraceStore(paths["columns"], readonly=True) as a, TraceStore(paths["maps"], readonly=True) as b:
        assert pack(step_to_wire(a.read_step(kind, 0))) == pack(step_to_wire(b.read_step(kind, 0)))
        assert pack(sorted(a.read_graph(kind, 0).items())) == pack(sorted(b.read_graph(kind, 0).items()))


@pytest.mark.parametrize("change", ["time", "shape"])
def test_a_step_the_columns_cannot_hold_is_refused_by_name(tmp_path: Path, change: str) -> None:
    """A node whose time is not its first run's, or an input shape on a slot without a child: the columns
    derive both, so such a step (built by hand) is refused, naming the node, and the file keeps the steps it
    held (NOTE [Columns of any step]); `st.to_html()` refuses it the same way."""
    st = _steps("mlp", "python")[0]
    nodes = list(st.nodes)
    k = next(k for k, n in enumerate(nodes) if n.runs and None in n.input_shapes and n.time_us is not None)
    if change == "time":
        nodes[k] = dataclasses.replace(nodes[k], time_us=nodes[k].time_us + 1.0)
        why = f"node {k}'s order, time or gradients are not its first run's"
    else:
        nodes[k] = dataclasses.replace(nodes[k], input_shapes=[s or (9, 9) for s in nodes[k].input_shapes])
        why = f"node {k}'s slot {nodes[k].input_shapes.index((9, 9))} has an input shape (9, 9) but no child"
    changed = dataclasses.replace(st, nodes=nodes, step=1)
    path = tmp_path / "t.sqlite"
    _store(path, [st], True)
    with TraceStore(path) as store:
        refused = f"step 1 of run 'mlp' cannot be written as columns: {why}"
        with pytest.raises(TraceFormatError, match=re.escape(refused)):
            store.write_step(changed)
        assert [s["step"] for s in store.steps(st.run)] == [0]
        back = store.read_step(st.run, 0)
    assert [n.name for n in back.nodes] == [n.name for n in st.nodes] and back.edges == st.edges
    assert [n.time_us for n in back.nodes] == [n.time_us for n in st.nodes]
    with pytest.raises(TraceFormatError, match=re.escape(why)):
        changed.to_html(tmp_path / "step.html")


def test_a_file_holds_steps_of_both_forms(tmp_path: Path) -> None:
    """A file written by the previous release (maps) and then by this one (columns): both steps read."""
    steps = _steps("transformer")
    path = tmp_path / "t.sqlite"
    _store(path, steps[:1], False)
    _store(path, steps[1:], True)
    with TraceStore(path, readonly=True) as store:
        for st in steps:
            back = store.read_step(st.run, st.step)
            assert len(back.nodes) == len(st.nodes) and back.edges == st.edges
            assert [n.name for n in back.nodes] == [n.name for n in st.nodes]
            lazy = store.read_indexed(st.run, st.step)
            assert lazy["nodes"][0] == store.read_graph(st.run, st.step)["nodes"][0]


@pytest.mark.parametrize("recorder", RECORDERS)
def test_the_columns_hold_each_gradient_as_torch_gives_it(tmp_path: Path, recorder: str) -> None:
    """The stored statistics of a parameter's gradient are those of `p.grad` (the step's only backward)."""
    case = build("mlp")
    path = tmp_path / "t.sqlite"
    with gradscape.Tracer(case.model, run="g", sink=FileSink(path), recorder=recorder) as tr, tr.step(0):
        case.loss(case.model, case.batch).backward()
    with sqlite3.connect(path) as db:
        assert "columns" in unpack(decompress(db.execute("SELECT graph FROM steps").fetchone()[0]))
    with TraceStore(path, readonly=True) as store:
        graph = store.read_graph("g", 0)
    for name, p in case.model.named_parameters():
        t = graph["tensors"][graph["params"][name]]
        assert t["shape"] == list(p.shape)
        assert t["stats"][4] == pytest.approx(float(p.grad.double().norm()), rel=1e-5)  # the norm


@pytest.mark.parametrize("damage", ["slots", "plan_code", "version", "tables"])
def test_a_damaged_column_document_is_named(tmp_path: Path, damage: str) -> None:
    case = build("mlp")
    path = tmp_path / "t.sqlite"
    with gradscape.Tracer(case.model, run="d", sink=FileSink(path)) as tr, tr.step(0):
        case.loss(case.model, case.batch).backward()
    db = sqlite3.connect(path)
    (blob,) = db.execute("SELECT graph FROM steps").fetchone()
    doc = unpack(decompress(blob))
    cols = doc["columns"]
    if damage == "slots":
        cols["nodes"]["slots"] = np.full(len(cols["nodes"]["slots"]) // 4, 10**6, "<i4").tobytes()
    elif damage == "plan_code":
        cols["tensors"]["plan_code"] = cols["tensors"]["plan_code"][:-4]
    elif damage == "tables":  # a name that is not a string: what only reading the step whole checks
        cols["nodes"]["name"][0] = 7
    else:
        cols["version"] = 99
    with db:
        db.execute("UPDATE steps SET graph = ?", (compress(pack(doc)),))
    db.close()
    with TraceStore(path, readonly=True) as store:
        where = r"columns.nodes.name\[0\]" if damage == "tables" else "columns"
        with pytest.raises(StoreError, match=f"step 0 of run 'd' in .* is malformed: {where}"):  # gradscape.load
            store.read_step("d", 0)
        if damage == "tables":
            return
        with pytest.raises(StoreError, match="step 0 of run 'd'.*columns"):
            store.read_indexed("d", 0)
        with pytest.raises(gradscape.tracer.wire.TraceFormatError, match="columns"):
            store.read_graph("d", 0)
