"""torch.distributed ranks streaming into one server: two gloo processes on CPU (tests/ddp_stream_worker.py)
send their steps to a real `gradscape serve`; both ranks' steps are stored side by side and read back
through the JSON API's `?rank=`, and the parameter gradients are checked against torch.autograd.grad."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist
from distributed_runs import run_ranks
from serving import ApiError, Server, free_port

from gradscape import TraceStore

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")

@pytest.fixture
def server(tmp_path: Path) -> Any:
    srv = Server(tmp_path / "ranks.sqlite", free_port()).start()
    yield srv
    srv.stop()


def test_ddp_ranks_stream_side_by_side(server: Server, tmp_path: Path) -> None:
    grads, infos = run_ranks(server.url, "ddp", "ddp", tmp_path / "out")
    for r, info in enumerate(infos):
        assert (info["rank"], info["world_size"], info["errors"]) == (r, 2, [])
        assert info["stats"]["dropped"] == 0 and info["stats"]["spilled"] == 0, info["stats"]
    (entry,) = [e for e in server.api("/api/runs")["runs"] if e["run"] == "ddp"]
    assert entry["ranks"] == [0, 1] and entry["steps"] == 2
    names = infos[0]["names"]
    stats: dict[int, dict[str, Any]] = {}
    for rank in (0, 1):
        assert [s["step"] for s in server.api(f"/api/runs/ddp/steps?rank={rank}")["steps"]] == [0, 1]
        g = server.api(f"/api/runs/ddp/steps/1?rank={rank}")
        assert (g["rank"], g["world_size"]) == (rank, 2)
        stats[rank] = {name: g["tensors"][g["params"][name]]["stats"] for name in names}
        # a node route on this rank: the parameter's AccumulateGrad node
        nid = next(n["id"] for n in g["nodes"] if n["param"] == names[0])
        node = server.api(f"/api/runs/ddp/steps/1/nodes/{nid}?rank={rank}")
        assert node["param"] == names[0] and node["grad_outputs"][0]["values"] is not None
    assert stats[0] == stats[1]  # all-reduced: the same gradient on both ranks
    with TraceStore(server.store, readonly=True) as store:  # the server's file, exact values
        for rank in (0, 1):
            st = store.read_step("ddp", 1, rank)
            assert st.rank == rank
            for name in names:
                got = st.params[name].values
                assert got is not None
                assert np.array_equal(got, grads[rank][f"1/{name}"]), (rank, name)  # what the optimizer saw
                assert np.array_equal(got, grads[0][f"1/{name}"]), (rank, name)  # equal across ranks
                ref = grads[rank][f"ref/{name.removeprefix('module.')}"]
                assert np.allclose(got, ref, rtol=1e-5, atol=1e-7), (rank, name)  # autograd.grad, averaged
    with pytest.raises(ApiError) as bad:
        server.api("/api/runs/ddp/steps/1?rank=x")
    assert bad.value.code == 400 and "rank" in bad.value.body
    with pytest.raises(ApiError) as missing:
        server.api("/api/runs/ddp/steps?rank=5")
    assert missing.value.code == 404 and "no rank 5" in missing.value.body
    with pytest.raises(ApiError) as neg:
        server.api("/api/runs/ddp/steps/1/nodes/0?rank=-1")
    assert neg.value.code == 400


def test_ranks_without_all_reduce_differ(server: Server, tmp_path: Path) -> None:
    grads, infos = run_ranks(server.url, "desync", "desync", tmp_path / "out")
    with TraceStore(server.store, readonly=True) as store:
        a, b = store.read_step("desync", 1, 0), store.read_step("desync", 1, 1)
    for name in infos[0]["names"]:
        va, vb = a.params[name].values, b.params[name].values
        assert va is not None and vb is not None
        assert np.allclose(va, grads[0][f"ref/{name}"], rtol=1e-5, atol=1e-7)  # rank-local autograd.grad
        assert np.allclose(vb, grads[1][f"ref/{name}"], rtol=1e-5, atol=1e-7)
        assert not np.allclose(va, vb)  # no all-reduce: the ranks disagree


def test_fsdp2_ranks_write_one_shared_file(tmp_path: Path) -> None:
    """FSDP2 (`fully_shard`) on gloo CPU, each rank's file sink writing the same SQLite file at once: both
    ranks' steps are there side by side, and `st.params[name]` is the rank's shard of the reduced gradient
    (what its optimizer steps with), exactly; the shards of the two ranks make up the whole gradient."""
    shared = tmp_path / "fsdp.sqlite"
    grads, infos = run_ranks(str(shared), "fsdp", "fsdp", tmp_path / "out")
    for r, info in enumerate(infos):
        assert (info["rank"], info["world_size"], info["errors"]) == (r, 2, [])
    for key in grads[0].files:
        if "/local/" not in key:
            assert np.array_equal(grads[0][key], grads[1][key]), key  # the reduced gradient, whole on each rank
    with TraceStore(shared, readonly=True) as store:
        assert store.ranks("fsdp") == [0, 1]
        for rank in (0, 1):
            assert [s["step"] for s in store.steps("fsdp", rank)] == [0, 1]
            st = store.read_step("fsdp", 1, rank)
            assert st.rank == rank and st.world_size == 2 and st.error is None and st.nodes
            # the monitor's row of each step: each parameter's norm is that of this rank's shard of its gradient
            rows = store.history("fsdp", rank)
            assert [r["step"] for r in rows] == [0, 1]
            for name in infos[rank]["names"]:
                shard = grads[rank][f"1/local/{name}"].astype(np.float64)
                assert rows[1]["param_norms"][name] == pytest.approx(float(np.linalg.norm(shard)), rel=1e-5), name
            assert sorted(st.params) == sorted(infos[rank]["names"])
            for name in infos[rank]["names"]:
                got = st.params[name].values
                assert got is not None and np.array_equal(got, grads[rank][f"1/local/{name}"]), (rank, name)
            # the AccumulateGrad nodes (of FSDP2's unsharded copies) are named after their parameter, and
            # what arrived there is this rank's own gradient, before the reduce-scatter
            acc = {n.param: n for n in st.nodes if n.name == "torch::autograd::AccumulateGrad"}
            assert sorted(p for p in acc if p) == sorted(infos[rank]["names"]), (rank, list(acc))
            for name in infos[rank]["names"]:
                arrived = acc[name].grad_outputs[0].values
                assert arrived is not None and np.allclose(arrived, grads[rank][f"ref/local/{name}"], rtol=1e-6,
                                                           atol=1e-7), (rank, name)
    for name in infos[0]["names"]:  # the two shards, in order along dim 0, are the whole gradient
        whole = np.concatenate([grads[0][f"1/local/{name}"], grads[1][f"1/local/{name}"]])
        assert np.array_equal(whole, grads[0][f"1/{name}"]), name


def test_server_keeps_each_ranks_step_and_refuses_a_rank_beyond_world_size(tmp_path: Path) -> None:
    """In-process (flask-socketio's test client): rank 0 and rank 1 send step 0 of one run; both are kept
    (no overwrite), the page hears of each (rank 1's notification names its rank: the same step number
    twice in a row would be no change to the page), and the steps list names the run's ranks; a rank
    outside 0 .. world_size - 1 is refused with an error naming it."""
    import time

    import torch
    from earlier_release import step_to_wire

    import gradscape
    from gradscape.app.server import ServerConfig, create_app
    from gradscape.tracer import protocol
    from gradscape.tracer.wire import pack

    dash_app, sio = create_app(str(tmp_path / "s.sqlite"), ServerConfig(notify_interval=0.02))
    try:
        lin = torch.nn.Linear(3, 2)
        tr = gradscape.Tracer(lin, run="r", tensors="full")
        wires = []
        for scale in (1.0, 5.0):
            lin.zero_grad()
            with tr.step(0) as st:
                (scale * lin(torch.ones(2, 3))).sum().backward()
            assert st is not None
            wires.append(step_to_wire(st))
        tr.close()
        acks = []
        ui = sio.test_client(dash_app.server, namespace="/ui")
        for rank, world, wire in ((0, 2, wires[0]), (1, 2, wires[1]), (3, 2, wires[1])):
            c = sio.test_client(dash_app.server, namespace="/tracer")
            c.emit("hello", protocol.envelope("hello", "r", 0, {"client": "t", "accepts": [1], "pid": rank,
                                                                "host": "h"}), namespace="/tracer", callback=True)
            data = pack({**wire, "rank": rank, "world_size": world})
            acks.append(c.emit("step_chunk", protocol.envelope("step_chunk", "r", 1, {
                "step": 0, "chunk": 0, "chunks": 1, "data": data}), namespace="/tracer", callback=True))
            c.disconnect(namespace="/tracer")
        assert acks[0]["ok"] and acks[1]["ok"]
        assert not acks[2]["ok"] and "rank 3 is outside 0 .. world_size - 1" in acks[2]["error"]
        store = dash_app.gradscape_state.store
        assert store.ranks("r") == [0, 1]
        b0, b1 = store.read_step("r", 0, 0).params["bias"].values, store.read_step("r", 0, 1).params["bias"].values
        assert b0 is not None and b1 is not None and np.allclose(b0, [2.0, 2.0]) and np.allclose(b1, [10.0, 10.0])
        want = [{"run": "r", "step": 0}, {"run": "r", "step": 0, "rank": 1}]
        heard: list[Any] = []
        deadline = time.monotonic() + 5
        while not all(w in heard for w in want) and time.monotonic() < deadline:
            heard += [m["args"][0] for m in ui.get_received("/ui") if m["name"] == "step"]
            time.sleep(0.02)
        assert all(w in heard for w in want), heard
        api = dash_app.server.test_client()
        for rank in (0, 1):
            answer = api.get(f"/api/runs/r/steps?rank={rank}").get_json()
            assert (answer["rank"], answer["ranks"], [s["step"] for s in answer["steps"]]) == (rank, [0, 1], [0])
    finally:
        dash_app.gradscape_state.notifier.stop()
