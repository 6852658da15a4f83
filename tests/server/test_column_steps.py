"""Steps sent to the server as columns (NOTE [Column document]): a step streamed by a real tracer to a real
`gradscape serve`, natively recorded or by the Python recorder (NOTE [Columns of any step]), is stored as columns
and reads back as the same step as the tracer's own file holds;
a tracer talking to a server of an earlier release, which reads no columns, sends it nothing, warns once and
keeps every step in its spill file (NOTE [Maps of earlier releases]); a malformed column step is refused with
an error naming what is wrong, and nothing of it is stored."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from earlier_release import step_to_wire
from serving import Server, finish, worker
from zoo import build

import gradscape
from gradscape.app.server import GradscapeApp, ServerConfig, create_app
from gradscape.tracer import protocol
from gradscape.tracer.blobs import decompress
from gradscape.tracer.record import native
from gradscape.tracer.wire import pack, unpack
from gradscape.tracer.wire.column_write import step_message

RECORDERS = [pytest.param("native", marks=pytest.mark.skipif(not native.status()[0], reason="no native recorder")),
             "python"]

_OLD_SERVER = ("-c", "import sys, gradscape.tracer.protocol as p; new = p.hello_ack; "
               "p.hello_ack = lambda: {k: v for k, v in new().items() if k != 'forms'}; "
               "import gradscape.app.server.namespaces as ns; from gradscape.tracer.wire import TraceFormatError; "
               "ns.column_step = lambda doc: (_ for _ in ()).throw(TraceFormatError('this server reads no columns')); "
               "from gradscape.app.cli import main; sys.exit(main())")


_COLUMNS_ONLY = ("-c", "import sys, gradscape.app.server.namespaces as ns; from gradscape.tracer.wire import "
                 "TraceFormatError; ns.step_from_wire = lambda doc: (_ for _ in ()).throw(TraceFormatError("
                 "'this server takes columns only')); from gradscape.app.cli import main; sys.exit(main())")


class ColumnsOnly(Server):
    """`gradscape serve` of this release, made to refuse a step sent as maps: a tracer must send it columns."""

    command = _COLUMNS_ONLY


class OldServer(Server):
    """`gradscape serve` as a release from before columns: its hello names no `forms`, and it refuses a step sent
    as columns (it would not know one). It stores what it checked as this release's store does."""

    command = _OLD_SERVER


def _forms(store: Path) -> list[bool]:
    """Per stored step (by step): was it stored as columns."""
    with sqlite3.connect(store) as db:
        return ["columns" in unpack(decompress(g)) for (g,) in db.execute("SELECT graph FROM steps ORDER BY step")]


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_tracer_sends_columns_to_a_server_that_reads_them(tmp_path: Path, recorder: str) -> None:
    srv = ColumnsOnly(tmp_path / "store.sqlite").start()
    try:
        ref = tmp_path / "reference.sqlite"
        res = finish(worker(srv.url, "live", "--steps", "3", "--file", str(ref), "--model", "transformer",
                            "--recorder", recorder))
        assert res["stats"] == {"sent": 3, "spilled": 0, "dropped": 0, "written": 3}
        # every step was taken as columns (the server refuses maps), and stored as it came
        assert _forms(srv.store) == _forms(ref) == [True] * 3
        for step in range(3):
            mine = step_to_wire(gradscape.load(ref, "live", step))
            got = step_to_wire(gradscape.load(srv.store, "live", step))
            assert pack(got) == pack(mine)  # every field, tensors numbered alike, thumbnails as stored
    finally:
        srv.stop()


def test_a_server_of_an_earlier_release_gets_nothing_and_the_steps_are_kept(tmp_path: Path) -> None:
    """Its hello names no "columns" form: the tracer sends it no step, warns once, naming why, and spills
    every step, which read back as the tracer's own file holds them."""
    srv = OldServer(tmp_path / "store.sqlite").start()
    try:
        ref, spill = tmp_path / "reference.sqlite", tmp_path / "spill.sqlite"
        proc = worker(srv.url, "live", "--steps", "3", "--file", str(ref), "--spill", str(spill))
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "Traceback" not in err, err
        res = json.loads(out.strip().splitlines()[-1])
        assert res["stats"] == {"sent": 0, "spilled": 3, "dropped": 0, "written": 3}
        assert err.count("is of an earlier release, which reads no step sent as columns") == 1, err
        assert not srv.store.exists() or _forms(srv.store) == []
        for step in range(3):
            assert pack(step_to_wire(gradscape.load(spill, "live", step))) == \
                pack(step_to_wire(gradscape.load(ref, "live", step)))
    finally:
        srv.stop()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[GradscapeApp]:
    created = create_app(str(tmp_path / "store.sqlite"), ServerConfig(notify_interval=0.02))
    yield created
    created.close()


def _message() -> dict[str, Any]:
    case = build("cnn")
    tr = gradscape.Tracer(case.model, run="r")
    with tr.step(3) as st:
        case.loss(case.model, case.batch).backward()
    msg = step_message(st)
    assert msg is not None
    return msg


def _send(app: GradscapeApp, doc: dict[str, Any]) -> dict[str, Any]:
    dash_app, sio = app
    c = sio.test_client(dash_app.server, namespace="/tracer")
    hello = c.emit("hello", protocol.envelope("hello", "r", 0, {"client": "t", "accepts": [1], "pid": 1, "host": "h"}),
                   namespace="/tracer", callback=True)
    assert hello["forms"] == ["maps", "columns"]
    return c.emit("step_chunk", protocol.envelope("step_chunk", "r", 1, {"step": 3, "chunk": 0, "chunks": 1,
                                                                          "data": pack(doc)}),
                  namespace="/tracer", callback=True)


def test_a_column_step_is_stored_as_sent_checked(app: GradscapeApp) -> None:
    msg = _message()
    msg["extra"] = {"x": 1}  # keys the schema does not have are not stored
    msg["columns"]["junk"] = b"\x00"
    msg["columns"]["nodes"]["junk"] = 1
    assert _send(app, msg)["ok"]
    store = app.state.store
    with sqlite3.connect(store.path) as db:
        (blob,) = db.execute("SELECT graph FROM steps").fetchone()
    doc = unpack(decompress(blob))
    assert "extra" not in doc and "junk" not in doc["columns"] and "junk" not in doc["columns"]["nodes"]
    graph = store.read_graph("r", 3)
    assert len(graph["nodes"]) == msg["columns"]["nodes"]["n"] and "arrays" not in graph


def _bytes(a: np.ndarray) -> bytes:
    return a.tobytes()


_DAMAGE: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("arrays", lambda m: m["arrays"].pop(), "arrays: expected [thumb, values] for each"),
    ("slots", lambda m: m["columns"]["nodes"].update(slots=_bytes(np.full(3, 10**6, "<i4"))), "columns: "),
    ("name", lambda m: m["columns"]["nodes"]["name"].__setitem__(0, 7), "columns.nodes.name[0]"),
    ("static", lambda m: m["columns"]["nodes"]["static"].__setitem__(0, ["s", "l", []]),
     "columns.nodes.static[0][1]"),
    ("child_off", lambda m: m["columns"]["nodes"].update(child_off=_bytes(np.zeros(
        len(m["columns"]["nodes"]["child_off"]) // 8, "<i8"))), "columns: offsets"),
    ("go_off", lambda m: m["columns"]["nodes"].update(  # past the slots once added, not wrapped around in 32 bits
        go_off=_bytes(np.full(len(m["columns"]["nodes"]["go_off"]) // 4, 2**31 - 1, "<i4")),
        go_n=_bytes(np.ones(len(m["columns"]["nodes"]["go_n"]) // 4, "<i4"))), "columns: offsets"),
    ("thumb", lambda m: m["arrays"][0].__setitem__(0, {"dtype": "<f4", "shape": [2, 2], "data": b"\x00"}),
     "tensors[0].thumb"),
    ("module", lambda m: next(iter(m["modules"].values()))["calls"][0].update(gi=[10**6]), "modules"),
    ("version", lambda m: m["columns"].update(version=2), "columns: not a column document"),
]


@pytest.mark.parametrize("what, damage, named", _DAMAGE, ids=[d[0] for d in _DAMAGE])
def test_a_malformed_column_step_is_refused_by_name(app: GradscapeApp, what: str,
                                                   damage: Callable[[dict[str, Any]], None], named: str) -> None:
    msg = _message()
    damage(msg)
    ack = _send(app, msg)
    assert ack["ok"] is False and named in ack["error"], ack
    assert app.state.store.steps("r") == []
