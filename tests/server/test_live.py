"""A real `gradscape serve` and real training processes streaming into it, faults included."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from earlier_release import step_to_wire
from serving import ApiError, Server, finish, free_port, get_json, worker

import gradscape
from gradscape.app.api import graph_json, node_json, node_tensor_indices


def _as_json(obj: object) -> object:
    import json

    return json.loads(json.dumps(obj))


def test_streamed_steps_equal_the_recorded_ones(server: Server, tmp_path: Path) -> None:
    ref = tmp_path / "reference.sqlite"
    res = finish(worker(server.url, "live", "--steps", "4", "--file", str(ref)))
    assert res["stats"] == {"sent": 4, "spilled": 0, "dropped": 0, "written": 4}
    assert res["acked"] == [0, 1, 2, 3]
    runs = server.api("/api/runs")["runs"]
    assert [r["run"] for r in runs] == ["live"] and runs[0]["steps"] == 4
    for step in range(4):
        mine = step_to_wire(gradscape.load(ref, "live", step))
        got = server.api(f"/api/runs/live/steps/{step}")
        assert got == _as_json(graph_json(mine))  # every node, edge, order and summary
        for nid in (0, len(mine["nodes"]) // 2, len(mine["nodes"]) - 1):
            arrays = {i: {"thumb": mine["tensors"][i]["thumb"], "values": mine["tensors"][i]["values"]}
                      for i in node_tensor_indices(mine["nodes"][nid])}
            node = server.api(f"/api/runs/live/steps/{step}/nodes/{nid}")
            assert node == _as_json(node_json(mine, nid, arrays))
            assert any(t and t["thumb"] for t in (node["grad_outputs"] or []) + (node["grad_inputs"] or []))


def test_api_errors_are_named(server: Server) -> None:
    finish(worker(server.url, "r", "--steps", "1", "--model", "mlp"))
    for path, status, text in [("/api/runs/nope/steps", 404, "no run 'nope'"),
                               ("/api/runs/r/steps/9", 404, "no step 9 in run 'r'"),
                               ("/api/runs/r/steps/x", 400, "step must be an integer in 0.."),
                               ("/api/runs/r/steps/0/nodes/999", 404, "no node 999")]:
        with pytest.raises(ApiError) as err:
            server.api(path)
        assert err.value.code == status
        assert text in err.value.body


def test_server_absent_at_start_spills_and_serve_shows_them(tmp_path: Path) -> None:
    port = free_port()
    spill = tmp_path / "spill.sqlite"
    t0 = time.monotonic()
    res = finish(worker(f"http://127.0.0.1:{port}", "offline", "--steps", "5", "--spill", str(spill)))
    assert time.monotonic() - t0 < 60
    assert res["stats"] == {"sent": 0, "spilled": 5, "dropped": 0}
    assert res["max_write_ms"] < 50  # the loop never waited on the network
    srv = Server(spill, port).start()
    try:
        assert [s["step"] for s in srv.api("/api/runs/offline/steps")["steps"]] == [0, 1, 2, 3, 4]
        assert srv.api("/api/runs/offline/steps/4")["nodes"]
    finally:
        srv.stop()


def test_sigkill_mid_run_then_restart(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    servers = [Server(store).start()]
    port = servers[0].port
    proc = worker(servers[0].url, "crash", "--steps", "150", "--pause", "0.1", "--spill", str(tmp_path / "s.sqlite"))
    try:
        assert proc.stdout is not None
        back_at = None
        res = None
        for line in proc.stdout:
            if line.startswith("step 15") and len(servers) == 1 and servers[0].proc and \
                    servers[0].proc.poll() is None:
                servers[0].kill()
            if line.startswith("step 25") and len(servers) == 1:
                servers.append(Server(store, port).start())
            if line.startswith("step ") and len(servers) == 2 and back_at is None:
                back_at = int(line.split()[1])  # the first step the training loop ran with the server back
            if line.startswith("{"):
                res = json.loads(line)
        err = proc.stderr.read() if proc.stderr else ""
        assert proc.wait(60) == 0 and "Traceback" not in err, err
        assert res is not None and back_at is not None and back_at < 140
        assert res["max_write_ms"] < 50 and res["max_step_ms"] < 2000  # no stall
        stored = {s["step"] for s in servers[1].api("/api/runs/crash/steps")["steps"]}
        assert max(stored) > back_at  # it reconnected after the restart and later steps arrived
        assert set(res["acked"]) <= stored  # every acknowledged step survived the SIGKILL
        assert res["stats"]["sent"] + res["stats"]["spilled"] == 150 and res["stats"]["dropped"] == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
        for srv in servers:
            srv.stop()
    db = sqlite3.connect(store)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


def test_four_tracers_at_once(server: Server) -> None:
    procs = [worker(server.url, f"w{k}", "--steps", "6", "--model", ["mlp", "cnn", "transformer", "tied"][k])
             for k in range(4)]
    results = [finish(p) for p in procs]
    assert all(r["stats"]["sent"] == 6 for r in results)
    runs = {r["run"]: r["steps"] for r in server.api("/api/runs")["runs"]}
    assert runs == {"w0": 6, "w1": 6, "w2": 6, "w3": 6}


def test_foreign_host_header_is_refused(server: Server) -> None:
    with pytest.raises(ApiError) as err:
        get_json(server.url + "/api/runs", headers={"Host": f"evil.example:{server.port}"})
    assert err.value.code == 403 and "DNS rebinding" in err.value.body
    with pytest.raises(ApiError):
        get_json(server.url + "/", headers={"Host": "attacker.test"})
    assert get_json(server.url + "/api/runs", headers={"Host": f"localhost:{server.port}"}) == {"runs": []}


def test_token_is_required_when_set(tmp_path: Path) -> None:
    srv = Server(tmp_path / "s.sqlite", 0, "--token", "s3cret").start()
    try:
        assert f"http://127.0.0.1:{srv.port}/?token=s3cret" in srv.log.read_text()  # the URL carries the token
        with pytest.raises(ApiError) as err:
            srv.api("/api/runs")
        assert err.value.code == 401
        assert srv.api("/api/runs", headers={"Authorization": "Bearer s3cret"}) == {"runs": []}
        import socketio

        bad = socketio.Client(reconnection=False)
        with pytest.raises(socketio.exceptions.ConnectionError):
            bad.connect(srv.url, namespaces=["/tracer"], auth={"token": "wrong"}, transports=["websocket"],
                        wait_timeout=5)
        res = finish(worker(srv.url + "?token=s3cret", "tok", "--steps", "2", "--model", "mlp"))
        assert res["stats"]["sent"] == 2
        wrong = finish(worker(srv.url + "?token=nope", "tok2", "--steps", "1", "--model", "mlp",
                              "--spill", str(tmp_path / "sp.sqlite")))
        assert wrong["stats"] == {"sent": 0, "spilled": 1, "dropped": 0}
    finally:
        srv.stop()
