"""Socket handlers in-process (flask-socketio's test client): handshake, chunked steps, notifications,
and a corpus of malformed messages, each answered with an error that names the problem."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from earlier_release import step_to_wire
from zoo import build

import gradscape
from gradscape.app.server import GradscapeApp, ServerConfig, create_app
from gradscape.tracer import protocol
from gradscape.tracer.wire import pack


@pytest.fixture
def app(tmp_path: Path) -> Iterator[GradscapeApp]:
    created = create_app(str(tmp_path / "store.sqlite"), ServerConfig(notify_interval=0.02))
    yield created
    created.close()


def _step(name: str = "mlp", run: str = "r") -> gradscape.StepTrace:
    case = build(name)
    tr = gradscape.Tracer(case.model, run=run)
    with tr.step(3) as st:
        case.loss(case.model, case.batch).backward()
    assert st is not None
    return st


def _client(app: GradscapeApp, ns: str = "/tracer", **kw: Any) -> Any:
    dash_app, sio = app
    return sio.test_client(dash_app.server, namespace=ns, **kw)


def _msg(type_: str, payload: dict[str, Any], run: str = "r", seq: int = 0) -> dict[str, Any]:
    return protocol.envelope(type_, run, seq, payload)


def _send_step(c: Any, st: gradscape.StepTrace, chunk_bytes: int = protocol.CHUNK_BYTES) -> list[dict[str, Any]]:
    data = pack(step_to_wire(st))
    parts = [data[i:i + chunk_bytes] for i in range(0, len(data), chunk_bytes)]
    return [c.emit("step_chunk", _msg("step_chunk", {"step": st.step, "chunk": k, "chunks": len(parts),
                                                     "data": p}, run=st.run, seq=k + 1),
                   namespace="/tracer", callback=True) for k, p in enumerate(parts)]


def test_hello_and_chunked_step_are_stored_whole(app: GradscapeApp) -> None:
    c = _client(app)
    ack = c.emit("hello", _msg("hello", {"client": "t", "accepts": [1], "pid": 1, "host": "h"}), namespace="/tracer",
                 callback=True)
    assert ack["ok"] and ack["protocol"] == 1 and ack["max_message"] == protocol.MAX_MESSAGE
    st = _step()
    store = app.state.store
    acks = _send_step(c, st, chunk_bytes=2000)  # many chunks
    assert len(acks) > 3 and all(a["ok"] for a in acks)
    assert [a["stored"] for a in acks] == [False] * (len(acks) - 1) + [True]
    assert store.steps("r")[0]["step"] == 3
    assert store.read_step("r", 3).nodes[0].name == st.nodes[0].name


def test_ui_hears_about_new_steps(app: GradscapeApp) -> None:
    ui = _client(app, "/ui")
    c = _client(app)
    c.emit("hello", _msg("hello", {"client": "t", "accepts": [1], "pid": 1, "host": "h"}), namespace="/tracer",
           callback=True)
    _send_step(c, _step())
    deadline = time.monotonic() + 3
    got: list[tuple[str, Any]] = []
    while time.monotonic() < deadline and not {"run", "tracer", "step"} <= {n for n, _ in got}:
        for m in ui.get_received("/ui"):
            arg = m["args"][0] if m["args"] else None
            catchup = m["name"] == "step" and isinstance(arg, dict) and arg.get("catchup")
            got.append(("catchup" if catchup else m["name"], arg))
        time.sleep(0.02)
    names = [n for n, _ in got]
    # the page is caught up when it connects, then told about the new run, its step and the tracer
    assert names[0] == "catchup", names
    assert "run" in names and "tracer" in names
    assert ("step", {"run": "r", "step": 3}) in got, got


def test_wrong_protocol_version_names_the_accepted_ones(app: GradscapeApp) -> None:
    c = _client(app)
    ack = c.emit("hello", _msg("hello", {"accepts": [7]}), namespace="/tracer", callback=True)
    assert not ack["ok"] and "accepts [1]" in ack["error"]
    old = _msg("hello", {"accepts": [1]})
    old["v"] = 0
    ack = c.emit("hello", old, namespace="/tracer", callback=True)
    assert not ack["ok"] and "protocol version 0 is not accepted; this server accepts [1]" in ack["error"]


def _wire_blob(mutate: Callable[[dict[str, Any]], None]) -> bytes:
    wire = step_to_wire(_step())
    mutate(wire)
    return msgpack.packb(wire, use_bin_type=True)


def _chunk(data: bytes, **over: Any) -> dict[str, Any]:
    payload = {"step": 3, "chunk": 0, "chunks": 1, "data": data}
    payload.update(over)
    return _msg("step_chunk", payload)


BAD: list[tuple[str, str, Callable[[], Any], str]] = [
    ("not a map", "step_chunk", lambda: [1, 2], "expected one map"),
    ("missing run", "step_chunk", lambda: {k: v for k, v in _chunk(b"x").items() if k != "run"},
     "run: expected a string"),
    ("missing payload field", "step_chunk", lambda: _msg("step_chunk", {"chunk": 0, "chunks": 1, "data": b""}),
     "missing field 'step'"),
    ("wrong type", "step_chunk", lambda: _chunk(b"x", step="3"), "step: expected int, got str"),
    ("bool for int", "step_chunk", lambda: _chunk(b"x", chunks=True), "chunks: expected int, got bool"),
    ("negative step", "step_chunk", lambda: _chunk(b"x", step=-1), "must be >= 0"),
    ("chunk out of range", "step_chunk", lambda: _chunk(b"x", chunk=5, chunks=2), "must be 0..1"),
    ("too many chunks", "step_chunk", lambda: _chunk(b"x", chunks=10**9), "chunks: must be 1.."),
    ("oversized chunk", "step_chunk", lambda: _chunk(b"\0" * (protocol.CHUNK_BYTES + 1)), "per chunk"),
    ("NaN time", "step_chunk", lambda: {**_chunk(b"x"), "time": math.nan}, "time: must be a finite number"),
    ("seq negative", "step_chunk", lambda: {**_chunk(b"x"), "seq": -4}, "seq: must be >= 0"),
    ("type mismatch", "step_chunk", lambda: {**_chunk(b"x"), "type": "hello"}, "sent as event 'step_chunk'"),
    ("garbage data", "step_chunk", lambda: _chunk(b"\xc1\xc1\xc1"), "not a msgpack document"),
    ("non-UTF-8 name", "step_chunk",
     lambda: _chunk(msgpack.packb({"v": 1, "run": b"\xff\xfe"}, use_bin_type=False)), "not a msgpack document"),
    ("control chars in run", "step_chunk", lambda: {**_chunk(b"x"), "run": "a\x00b"}, "control characters"),
    ("negative shape", "step_chunk",
     lambda: _chunk(_wire_blob(lambda w: w["tensors"][0].update(shape=[-2, 3]))), "non-negative ints"),
    ("huge shape", "step_chunk",
     lambda: _chunk(_wire_blob(lambda w: w["tensors"][0]["thumb"].update(shape=[1 << 20, 1 << 20]))),
     "elements, more than"),
    ("bytes disagree with shape", "step_chunk",
     lambda: _chunk(_wire_blob(lambda w: w["tensors"][0]["thumb"].update(data=b"\0" * 7))), "bytes of data"),
    ("run mismatch", "step_chunk", lambda: {**_chunk(_wire_blob(lambda w: None)), "run": "other"},
     "data is run 'r' step 3"),
    ("unknown event", "fly", lambda: _msg("fly", {}), "unknown event 'fly'"),
    ("status negative", "status", lambda: _msg("status", {"sent": -1, "spilled": 0, "dropped": 0}),
     "sent: must be >= 0"),
]


@pytest.mark.parametrize("event, build_msg, expect", [(e, b, x) for _, e, b, x in BAD], ids=[b[0] for b in BAD])
def test_malformed_messages_get_clear_errors(app: GradscapeApp, event: str, build_msg: Callable[[], Any],
                                              expect: str) -> None:
    bad = _client(app)
    good = _client(app)
    ack = bad.emit(event, build_msg(), namespace="/tracer", callback=True)
    assert isinstance(ack, dict) and ack["ok"] is False
    assert expect in ack["error"], ack["error"]
    store = app.state.store
    assert store.runs() == []  # nothing partial stored
    assert all(a["ok"] for a in _send_step(good, _step(run="fine")))  # other clients carry on
    assert [r["run"] for r in store.runs()] == ["fine"]
    assert bad.is_connected("/tracer")


def test_duplicate_chunk_is_refused(app: GradscapeApp) -> None:
    c = _client(app)
    msg = _chunk(b"abc", chunks=2)
    assert c.emit("step_chunk", msg, namespace="/tracer", callback=True)["ok"]
    ack = c.emit("step_chunk", msg, namespace="/tracer", callback=True)
    assert not ack["ok"] and "already received" in ack["error"]


def test_token_checked_on_connect(tmp_path: Path) -> None:
    created = create_app(str(tmp_path / "t.sqlite"), ServerConfig(token="abc"))
    dash_app, sio = created
    try:
        bad = sio.test_client(dash_app.server, namespace="/tracer", auth={"token": "nope"})
        assert not bad.is_connected("/tracer")
        good = sio.test_client(dash_app.server, namespace="/tracer", auth={"token": "abc"})
        assert good.is_connected("/tracer")
        ui = sio.test_client(dash_app.server, namespace="/ui", auth={"token": "nope"})
        assert not ui.is_connected("/ui")
    finally:
        created.close()


def _send_wire(c: Any, wire: dict[str, Any], step: int = 3) -> dict[str, Any]:
    return c.emit("step_chunk", _msg("step_chunk", {"step": step, "chunk": 0, "chunks": 1, "data": pack(wire)}),
                  namespace="/tracer", callback=True)


@pytest.mark.parametrize("field, value, named", [
    ("modules", [1], "modules: expected a map"),
    ("passes", [7], "passes[0]: expected a map"),
    ("execution", [[1]], "execution[0]"),
    ("meta", {"k": [b"x"]}, "meta.k[0]"),
])
def test_malformed_step_fields_are_acked_with_the_field(app: GradscapeApp, field: str, value: Any,
                                                        named: str) -> None:
    wire = step_to_wire(_step())
    wire[field] = value
    ack = _send_wire(_client(app), wire)
    assert ack["ok"] is False and named in ack["error"], ack
    assert app.state.store.steps("r") == []


def test_unknown_keys_are_not_stored(app: GradscapeApp) -> None:
    wire = step_to_wire(_step())
    wire["nodes"][0]["extra"] = b"\x00"
    wire["extra"] = {"x": 1}
    assert _send_wire(_client(app), wire)["ok"]
    graph = app.state.store.read_graph("r", 3)
    assert "extra" not in graph and "extra" not in graph["nodes"][0]


def test_a_store_failure_is_acked_not_raised(app: GradscapeApp) -> None:
    c = _client(app)
    app.state.store.close()  # a real fault: the trace file is gone from under the server
    ack = _send_wire(c, step_to_wire(_step()))
    assert ack["ok"] is False and "server error on 'step_chunk'" in ack["error"]
    status = c.emit("status", _msg("status", {"sent": 1, "spilled": 0, "dropped": 0}), namespace="/tracer",
                    callback=True)
    assert status == {"ok": True}  # the namespace carries on


def test_close_stops_the_notifier_thread(tmp_path: Path) -> None:
    created = create_app(str(tmp_path / "c.sqlite"), ServerConfig(notify_interval=0.01))
    thread = created.state.notifier._thread
    assert thread is not None and thread.is_alive()
    created.close()
    assert not thread.is_alive()
    created.close()  # idempotent
