"""The step index (NOTE [Step index]) and the page's lazy read of a stored step (`TraceStore.read_indexed`):
the index says what the step's node and tensor maps say, the lazy step reads as the whole one, and the page
opens a folded loop without decoding every node; for each stored form of a step (`form`: columns, NOTE [Column
document], from either recorder, and the maps earlier releases stored)."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch
from earlier_release import pack_step, step_to_wire, write_maps
from zoo import ZOO, build, loop_model, loop_step

import gradscape
from gradscape.app import view
from gradscape.app.data import PageData
from gradscape.app.view.colours import arrived, statistic
from gradscape.app.view.step_fields import node_module, nonfinite, stat, tensor
from gradscape.tracer.blobs import compress, decompress
from gradscape.tracer.record import native
from gradscape.tracer.sinks.file import FileSink
from gradscape.tracer.store import StoreError, TraceStore
from gradscape.tracer.wire import pack, unpack
from gradscape.tracer.wire.lazy import LazyItems
from gradscape.tracer.wire.step_index import COLOURINGS, index_from_wire


@pytest.fixture(params=["columns", "traces", "maps"])
def form(request: pytest.FixtureRequest) -> str:
    """How the steps recorded in the test are stored: as columns from the native recorder's tables, as columns
    made from the Python recorder's `NodeTrace`s (NOTE [Columns of any step]), or as the maps earlier releases
    wrote (and a server writes of a step the columns cannot hold)."""
    used, why = native.status()
    if request.param == "columns" and not used:
        pytest.skip(f"the native recorder is not built: {why}")
    return str(request.param)


class MapsSink(FileSink):
    """A file sink that stores each step as maps, the form of earlier releases."""

    def write(self, st: gradscape.StepTrace) -> None:
        write_maps(self.store, step_to_wire(st))


def _recorder(form: str | None) -> str | None:
    """The recorder whose steps are stored in `form` (None: the Tracer's default)."""
    return None if form in (None, "maps") else {"columns": "native", "traces": "python"}[form]


def _sink(path: Path, form: str | None, keep_last: int | None = None) -> FileSink:
    return (MapsSink if form == "maps" else FileSink)(path, keep_last=keep_last)


def _record(path: Path, name: str, steps: int = 1, keep_last: int | None = None, form: str | None = None) -> None:
    case = build(name)
    with gradscape.Tracer(case.model, run=name, sink=_sink(path, form, keep_last), recorder=_recorder(form)) as tr:
        for i in range(steps):
            with tr.step(i):
                case.loss(case.model, case.batch).backward()


def _record_loop(path: Path, length: int, form: str) -> None:
    torch.manual_seed(0)
    with gradscape.Tracer(loop_model(), run="loop", sink=_sink(path, form), recorder=_recorder(form)) as tr:
        loop_step(tr, 0, length)


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def _expected(wire: Any) -> dict[str, Any]:
    """What the index must hold, read from the maps one node at a time."""
    nodes = wire["nodes"]
    sent = []
    for n in nodes:
        row = []
        for j in n["gi"] or []:
            t = tensor(wire, j)
            row.append(None if t is None else (stat(t, "norm") or 0.0))
        sent.append(row)
    badges = []
    for n in nodes:
        counts = [nonfinite(tensor(wire, j)) for j in (n["go"] or []) + (n["gi"] or []) if j is not None]
        if any(a or b for a, b in counts):
            badges.append([n["id"], sum(a for a, _ in counts), sum(b for _, b in counts)])
    return {"modules": [node_module(n) for n in nodes], "names": [n["name"] for n in nodes],
            "values": {c: [statistic(arrived(wire, n), c) for n in nodes] for c in COLOURINGS},
            "accumulated": {n["param"]: n["order"] for n in nodes if n["param"] and n["order"] is not None},
            "param_node": {n["param"]: n["id"] for n in nodes if n["param"]}, "sent": sent, "badges": badges}


@pytest.mark.parametrize("name", [*ZOO, "nan"])
def test_the_stored_index_says_what_the_maps_say(tmp_path: Path, form: str, name: str) -> None:
    path = tmp_path / "t.sqlite"
    if name == "nan":  # a step whose gradients hold NaN and Inf: badges
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
        with gradscape.Tracer(model, run=name, sink=_sink(path, form), recorder=_recorder(form)) as tr, tr.step(0):
            (model(torch.randn(2, 3)).sqrt() * torch.tensor([[math.inf], [1.0]])).sum().backward()
    else:
        _record(path, name, form=form)
    with TraceStore(path, readonly=True) as store:
        wire = store.read_graph(name, 0)
        index = store.read_indexed(name, 0).index  # type: ignore[attr-defined]
    want = _expected(wire)
    assert [index.module_of(k) for k in range(len(wire["nodes"]))] == want["modules"]
    assert [index.names[c] for c in index.name_code] == want["names"]
    for c in COLOURINGS:
        assert all(_same(a, b) for a, b in zip(index.values[c], want["values"][c], strict=True)), c
    assert index.accumulated == want["accumulated"] and index.param_node == want["param_node"]
    assert index.badges == want["badges"]
    if name == "nan":
        assert index.badges, "the step has NaN and Inf gradients: some node has a badge"
    for k, row in enumerate(want["sent"]):
        slots = [[k, 0, j] for j in range(len(row))]
        assert index.sent_norms(slots) == pytest.approx([v for v in row if v is not None], nan_ok=True)


def test_the_lazy_step_reads_as_the_whole_one(tmp_path: Path, form: str) -> None:
    path = tmp_path / "t.sqlite"
    _record(path, "transformer", steps=2, form=form)
    with TraceStore(path, readonly=True) as store:
        whole, lazy = store.read_graph("transformer", 1), store.read_indexed("transformer", 1)
    assert isinstance(lazy["nodes"], LazyItems) and isinstance(lazy["tensors"], LazyItems)
    assert lazy["nodes"][3] == whole["nodes"][3] and lazy["nodes"][-1] == whole["nodes"][-1]
    assert lazy["tensors"][1:4] == whole["tensors"][1:4]
    assert dict(lazy) == whole  # every field, the maps decoded as a whole on the comparison
    with pytest.raises(IndexError):
        lazy["nodes"][len(whole["nodes"])]


def test_pack_step_reads_back_as_the_step(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    _record(path, "grabbag")
    with TraceStore(path, readonly=True) as store:
        whole = store.read_graph("grabbag", 0)
    doc, spans = pack_step(whole)
    assert unpack(doc) == whole
    assert set(spans) == {"nodes", "tensors"}


def test_the_page_reads_the_same_from_the_index_as_from_the_maps(tmp_path: Path, form: str) -> None:
    """Every view the page opens a step with: from the stored index and lazy maps, and from the whole step."""
    path = tmp_path / "t.sqlite"
    _record_loop(path, 60, form)  # about 900 nodes: opened folded
    with TraceStore(path, readonly=True) as store:
        whole, lazy = store.read_graph("loop", 0), store.read_indexed("loop", 0)
    assert len(whole["nodes"]) > 300
    for wire in (whole, lazy):
        assert view.default_collapse(wire) == {"cell", "head"}
    for folds in (None, ["head"], []):
        a, b = view.layout_graph(whole, folds), view.layout_graph(lazy, folds)
        assert a == b
        assert view.cytoscape_elements(whole, a) == view.cytoscape_elements(lazy, b)
    assert view.step_marks(whole) == view.step_marks(lazy)
    assert view.exec_order(whole) == view.exec_order(lazy)
    assert view.flow_rows(whole) == view.flow_rows(lazy)


def test_the_player_order_names_each_node_by_index(tmp_path: Path, form: str) -> None:
    path = tmp_path / "t.sqlite"
    _record(path, "transformer", form=form)
    with TraceStore(path, readonly=True) as store:
        wire = store.read_indexed("transformer", 0)
    order = view.exec_order(wire)
    seen_modules: list[str] = []
    for k, (nid, _run) in enumerate(wire["execution"]):
        node = wire["nodes"][nid]
        assert order["nodes"][k] == nid and view.order_name(order, k) == node["name"]
        module = node_module(node)
        if module is not None and module not in seen_modules:
            seen_modules.append(module)
        assert order["module_of"][k] == (-1 if module is None else seen_modules.index(module))
    assert order["modules"] == seen_modules  # by first execution


def test_a_folded_loop_opens_without_decoding_every_node(tmp_path: Path, form: str) -> None:
    path = tmp_path / "t.sqlite"
    _record_loop(path, 200, form)  # about 3,000 nodes
    data = PageData(TraceStore(path, readonly=True))
    wire = data.graph("loop", 0)
    layout = data.layout("loop", 0, None)
    view.cytoscape_elements(wire, layout, "norm", data.marks("loop", 0, "norm"))
    data.order("loop", 0)
    nodes = wire["nodes"]
    decoded = sum(item is not None for item in nodes._items)  # type: ignore[attr-defined]
    assert len(nodes) > 2500 and decoded < 50, decoded


def test_an_index_not_written_with_its_step_is_not_read(tmp_path: Path) -> None:
    """A release from before indexes replaced the step (its `created` differs), or the file has no index
    table at all: the step is read whole, and the page sees it as it is."""
    path = tmp_path / "t.sqlite"
    _record(path, "mlp")
    with TraceStore(path, readonly=True) as store:
        whole = store.read_graph("mlp", 0)
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE steps SET created = created + 1")
    with TraceStore(path, readonly=True) as store:
        stale = store.read_indexed("mlp", 0)
    assert isinstance(stale["nodes"], list) and dict(stale) == whole
    assert stale.index.n_nodes == len(whole["nodes"])  # type: ignore[attr-defined]
    with db:
        db.execute("DROP TABLE step_index")
    db.close()
    with TraceStore(path, readonly=True) as store:
        assert dict(store.read_indexed("mlp", 0)) == whole


def test_a_damaged_span_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    _record(path, "mlp", form="maps")  # a step stored as maps, with spans
    db = sqlite3.connect(path)
    (blob,) = db.execute("SELECT idx FROM step_index").fetchone()
    stored = unpack(decompress(blob))
    stored["spans"]["tensors"][1] = stored["spans"]["tensors"][1][:-4]  # the last tensor left out
    with db:
        db.execute("UPDATE step_index SET idx = ?", (compress(pack(stored)),))
    db.close()
    with TraceStore(path, readonly=True) as store, pytest.raises(StoreError, match="step 0 of run 'mlp'.*spans"):
        store.read_indexed("mlp", 0)


def test_keep_last_drops_the_indexes_of_the_steps_it_drops(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    _record(path, "mlp", steps=4, keep_last=2)
    db = sqlite3.connect(path)
    assert [s for (s,) in db.execute("SELECT step FROM step_index ORDER BY step")] == [2, 3]
    db.close()


def test_the_index_of_a_step_in_wire_form_matches_the_stored_one(tmp_path: Path, form: str) -> None:
    path = tmp_path / "t.sqlite"
    _record(path, "cnn", form=form)
    with TraceStore(path, readonly=True) as store:
        stored = store.read_indexed("cnn", 0).index  # type: ignore[attr-defined]
        made = index_from_wire(store.read_graph("cnn", 0))
    assert stored.modules == made.modules and stored.module_code == made.module_code
    assert stored.sent.tolist() == pytest.approx(made.sent.tolist(), nan_ok=True)
