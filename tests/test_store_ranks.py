"""Ranks in the trace file: steps of several ranks side by side, two processes writing one file at
once, and version-1 files (before ranks) migrated in place."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from earlier_release import step_to_wire, write_maps

import gradscape
from gradscape import TraceStore, load
from gradscape.tracer.store import StoreError


def _wire(run: str = "r", step: int = 0, rank: int | None = None, scale: float = 1.0) -> dict:
    lin = torch.nn.Linear(3, 2)
    tr = gradscape.Tracer(lin, run=run, tensors="full")
    with tr.step(step) as st:
        (lin(torch.ones(4, 3)) * scale).sum().backward()
    tr.close()
    assert st is not None
    wire = step_to_wire(st)
    wire["rank"], wire["world_size"] = rank, None if rank is None else 2
    return wire


def test_ranks_are_stored_side_by_side(tmp_path: Path) -> None:
    with TraceStore(tmp_path / "t.sqlite") as store:
        write_maps(store, _wire(step=0, rank=0, scale=1.0))
        write_maps(store, _wire(step=0, rank=1, scale=3.0))
        assert store.ranks("r") == [0, 1]
        assert store.runs()[0]["ranks"] == [0, 1] and store.runs()[0]["steps"] == 1
        g0, g1 = store.read_step("r", 0, rank=0), store.read_step("r", 0, rank=1)
        assert (g0.rank, g1.rank) == (0, 1)
        b0, b1 = g0.params["bias"].values, g1.params["bias"].values
        assert b0 is not None and b1 is not None
        assert np.allclose(b1, 3 * b0)  # not overwritten
        with pytest.raises(StoreError, match="rank 2"):
            store.read_graph("r", 0, rank=2)
    assert load(tmp_path / "t.sqlite", rank=1).rank == 1


def test_outside_distributed_steps_are_rank_0(tmp_path: Path) -> None:
    with TraceStore(tmp_path / "t.sqlite") as store:
        write_maps(store, _wire(step=5, rank=None))
        assert store.ranks("r") == [0]
        assert store.steps("r")[0]["step"] == 5 and store.steps("r", rank=1) == []


_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_store_ranks import _wire, write_maps
    from gradscape import TraceStore
    rank, path = int(sys.argv[1]), sys.argv[2]
    wires = [_wire(step=i, rank=rank, scale=rank + 1.0) for i in range(3)]
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()  # both processes start writing together
    store = TraceStore(path)
    for _ in range(10):
        for w in wires:
            write_maps(store, w)
    store.close()
    print("done")
""")


def test_two_processes_write_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    code = _WRITER.format(tests=str(Path(__file__).parent))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r), str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    with TraceStore(path, readonly=True) as store:
        assert store.ranks("r") == [0, 1]
        for rank in (0, 1):
            assert [s["step"] for s in store.steps("r", rank)] == [0, 1, 2]
            for s in range(3):
                st = store.read_step("r", s, rank)
                assert st.rank == rank and st.params["bias"].values is not None


_V1 = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs(run TEXT PRIMARY KEY, created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE steps(run TEXT NOT NULL, step INTEGER NOT NULL, created REAL NOT NULL, n_nodes INTEGER NOT NULL,
    n_edges INTEGER NOT NULL, error TEXT, graph BLOB NOT NULL, PRIMARY KEY(run, step));
CREATE TABLE tensors(run TEXT NOT NULL, step INTEGER NOT NULL, idx INTEGER NOT NULL, arrays BLOB NOT NULL,
    PRIMARY KEY(run, step, idx));
"""


def test_version_1_file_is_migrated(tmp_path: Path) -> None:
    new, old = tmp_path / "new.sqlite", tmp_path / "old.sqlite"
    with TraceStore(new) as store:
        write_maps(store, _wire(step=4))
    src = sqlite3.connect(new)
    db = sqlite3.connect(old)
    db.executescript(_V1)
    db.execute("INSERT INTO meta VALUES('schema_version', '1')")
    db.executemany("INSERT INTO runs VALUES(?,?,?)", src.execute("SELECT * FROM runs"))
    db.executemany("INSERT INTO steps VALUES(?,?,?,?,?,?,?)",
                   src.execute("SELECT run, step, created, n_nodes, n_edges, error, graph FROM steps"))
    db.executemany("INSERT INTO tensors VALUES(?,?,?,?)", src.execute("SELECT run, step, idx, arrays FROM tensors"))
    db.commit()
    db.close()
    src.close()
    with pytest.raises(StoreError, match="version 1.*open it once for writing"):
        TraceStore(old, readonly=True)
    with TraceStore(old) as store:  # migrates
        assert store.ranks("r") == [0]
        assert store.runs()[0]["ranks"] == [0]
        st = store.read_step("r", 4)
        write_maps(store, _wire(step=4, rank=1))
        assert store.ranks("r") == [0, 1]
    assert st.step == 4 and st.params["weight"].values is not None
    assert load(old).step == 4
