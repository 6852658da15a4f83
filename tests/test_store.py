"""The SQLite trace file: versioned, WAL, raw arrays, readable while written, exact round trip (thumbnails
to within their 8-bit levels: NOTE [Compact thumbnails])."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zstandard
from earlier_release import step_to_wire
from zoo import build

import gradscape
from gradscape import TraceFormatError, TraceStore, load
from gradscape.tracer.wire import step_from_wire


def _traced(name: str = "transformer", mode: str = "full", run: str = "r1", steps: int = 2,
            sink: object = None) -> list[gradscape.StepTrace]:
    case = build(name)
    tr = gradscape.Tracer(case.model, run=run, tensors=mode, sink=sink, keep=steps)
    out = []
    for i in range(steps):
        with tr.step(i) as st:
            case.loss(case.model, case.batch).backward()
        out.append(st)
    tr.close()
    return out


def _same_thumb(x: np.ndarray, y: np.ndarray) -> None:
    """`y`, read back from a trace file, is `x` to within half of one of its 252 steps (NOTE [Compact
    thumbnails]), with NaN and ±Inf in the very same cells and the extremes exact."""
    assert x.shape == y.shape and y.dtype == np.float32
    fin = np.isfinite(x)
    assert np.array_equal(fin, np.isfinite(y)) and np.array_equal(x[~fin], y[~fin], equal_nan=True)
    if fin.any():
        lo, hi = float(x[fin].min()), float(x[fin].max())
        assert (float(y[fin].min()), float(y[fin].max())) == (lo, hi)
        bound = (hi - lo) / 252 / 2 * (1 + 1e-6) + 1e-7 * max(abs(lo), abs(hi))  # half a level, and float32's rounding
        assert np.all(np.abs(x[fin].astype(np.float64) - y[fin]) <= bound)


def _same_tensor(a: gradscape.TensorTrace | None, b: gradscape.TensorTrace | None, stored: bool = False) -> None:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert a.shape == b.shape and a.dtype == b.dtype and a.thumb_view == b.thumb_view
    assert a.stats.keys() == b.stats.keys()
    for k in a.stats:
        assert a.stats[k] == b.stats[k] or (np.isnan(a.stats[k]) and np.isnan(b.stats[k]))
    for x, y in ((a.thumb, b.thumb), (a.values, b.values)):
        assert (x is None) == (y is None)
        if x is not None and stored and x is a.thumb:
            _same_thumb(x, y)
        elif x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True)


def assert_same_step(a: gradscape.StepTrace, b: gradscape.StepTrace, stored: bool = False) -> None:
    """`b` is `a` read back (`stored`: from a trace file, which keeps thumbnails in 8 bits)."""
    assert (a.run, a.step, a.edges, a.execution, a.error) == (b.run, b.step, b.edges, b.execution, b.error)
    assert len(a.nodes) == len(b.nodes)
    for x, y in zip(a.nodes, b.nodes):
        for f in ("id", "name", "kind", "module", "param", "source", "schema", "order", "input_labels",
                  "input_args", "input_shapes", "output_shapes", "output_dtypes", "time_us"):
            assert getattr(x, f) == getattr(y, f), f
        for ga, gb in ((x.grad_inputs or [], y.grad_inputs or []), (x.grad_outputs or [], y.grad_outputs or [])):
            assert len(ga) == len(gb)
            for ta, tb in zip(ga, gb):
                _same_tensor(ta, tb, stored)
    assert a.params.keys() == b.params.keys()
    for k in a.params:
        _same_tensor(a.params[k], b.params[k], stored)
    assert a.modules.keys() == b.modules.keys()
    for k in a.modules:
        assert len(a.modules[k].calls) == len(b.modules[k].calls)
        for ca, cb in zip(a.modules[k].calls, b.modules[k].calls):
            for ta, tb in zip(ca.grad_input + ca.grad_output, cb.grad_input + cb.grad_output):
                _same_tensor(ta, tb, stored)


@pytest.mark.parametrize("mode", ["summary", "full"])
def test_file_sink_round_trip(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "run.sqlite"
    steps = _traced(mode=mode, sink=str(path))
    for st in steps:
        assert_same_step(st, load(path, "r1", st.step), stored=True)
    assert_same_step(steps[-1], load(path), stored=True)  # defaults: the newest run, its last step


def test_wire_form_shares_tensors_once() -> None:
    (st,) = _traced(name="mlp", steps=1)
    wire = step_to_wire(st)
    back = step_from_wire(msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False))
    assert_same_step(st, back)
    # a tensor on both ends of an edge is one entry, referenced twice: what the source sends on the edge's
    # slot is what the destination receives (each node of this MLP has one output)
    assert st.edges
    for src, dst, slot in st.edges:
        assert wire["nodes"][dst]["go"] == [wire["nodes"][src]["gi"][slot]], (src, dst, slot)
    refs = [i for n in wire["nodes"] for i in (n["gi"] or []) + (n["go"] or []) if i is not None]
    assert sorted(set(refs)) == list(range(len(wire["tensors"])))  # every entry is used, none is stored twice
    assert len(refs) == len(wire["tensors"]) + len(st.edges)  # the edges' tensors are the only ones shared


def test_schema_is_versioned_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    _traced(name="mlp", steps=1, sink=str(path))
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "5"
    blobs = [b for (b,) in db.execute("SELECT arrays FROM tensors")]
    blobs.append(db.execute("SELECT graph FROM steps").fetchone()[0])

    def raw(blob: bytes) -> bytes:  # a row under 512 bytes is kept as it is, a bigger one a Zstandard frame
        return zstandard.ZstdDecompressor().decompress(blob) if blob[:4] == b"\x28\xb5\x2f\xfd" else blob

    for blob in blobs:
        assert (raw(blob) is blob) == (len(raw(blob)) < 512), len(raw(blob))
    assert any(raw(b) is not b for b in blobs) and any(raw(b) is b for b in blobs)
    arrays = msgpack.unpackb(raw(blobs[0]), raw=False)
    assert set(arrays) == {"thumb", "values"} and isinstance(arrays["thumb"]["q8"], bytes)  # msgpack: no pickle
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(gradscape.StoreError, match="version '99'"):
        TraceStore(path)


def test_a_version_3_file_with_zlib_rows_reads_and_takes_new_steps(tmp_path: Path) -> None:
    """Version 3 deflated its rows with zlib: such a file reads as it is, and once opened for writing it is
    version 4, its old zlib rows and its new Zstandard ones side by side."""
    path = tmp_path / "v3.sqlite"
    steps = _traced(name="mlp", mode="full", steps=2, sink=str(path))
    db = sqlite3.connect(path)
    zstd = zstandard.ZstdDecompressor()

    def as_zlib(blob: bytes) -> bytes:
        return zlib.compress(zstd.decompress(blob), 3) if blob[:4] == b"\x28\xb5\x2f\xfd" else blob

    for table, col in (("steps", "graph"), ("tensors", "arrays")):
        rows = db.execute(f"SELECT rowid, {col} FROM {table}").fetchall()
        db.executemany(f"UPDATE {table} SET {col}=? WHERE rowid=?", [(as_zlib(b), r) for r, b in rows])
    db.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    db.execute("DELETE FROM steps WHERE step=1")
    db.execute("DELETE FROM tensors WHERE step=1")
    db.commit()
    assert db.execute("SELECT graph FROM steps").fetchone()[0][:1] == b"\x78"
    db.close()
    assert_same_step(steps[0], load(path, "r1", 0), stored=True)
    with TraceStore(path) as store:
        store.write_step(steps[1])
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "5"
    firsts = [g[:1] for (g,) in db.execute("SELECT graph FROM steps ORDER BY step")]
    db.close()
    assert firsts == [b"\x78", b"\x28"]
    assert_same_step(steps[0], load(path, "r1", 0), stored=True)
    assert_same_step(steps[1], load(path, "r1", 1), stored=True)


def test_a_damaged_row_is_named(tmp_path: Path) -> None:
    path = tmp_path / "d.sqlite"
    _traced(name="mlp", steps=1, sink=str(path))
    db = sqlite3.connect(path)
    graph = db.execute("SELECT graph FROM steps").fetchone()[0]
    db.execute("UPDATE steps SET graph=?", (graph[:-40],))
    db.commit()
    db.close()
    with pytest.raises(TraceFormatError, match="not a Zstandard frame"):
        load(path)


def test_not_a_trace_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(gradscape.StoreError, match="not a gradscape trace file"):
        load(bad)
    with pytest.raises(gradscape.StoreError, match="no trace file"):
        load(tmp_path / "missing.sqlite")


def test_missing_step_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    _traced(name="mlp", steps=1, sink=str(path))
    with pytest.raises(gradscape.StoreError, match="no step 7 of run 'r1'"):
        load(path, "r1", 7)


def test_readable_while_a_training_process_writes(tmp_path: Path) -> None:
    """Another process appends steps; this one reads complete steps while it does."""
    path = tmp_path / "live.sqlite"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import gradscape
        from zoo import build
        case = build("transformer")
        tr = gradscape.Tracer(case.model, run="live", sink={str(path)!r})
        for i in range(30):
            with tr.step(i):
                case.loss(case.model, case.batch).backward()
            print(i, flush=True)
        tr.close()
    """)
    seen = set()
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            step = int(line)
            if step % 3 == 0:
                st = load(path, "live", step)  # complete, while later steps are being written
                assert st.step == step and st.nodes and all(n.order is not None for n in st.nodes)
                seen.add(step)
        assert proc.wait(60) == 0
    assert len(seen) == 10
    with TraceStore(path, readonly=True) as store:
        assert [s["step"] for s in store.steps("live")] == list(range(30))
        assert store.runs()[0]["steps"] == 30


@pytest.mark.parametrize("mutate, message", [
    (lambda w: w.update(v=2), "wire version 2"),
    (lambda w: w.pop("nodes"), "missing field 'nodes'"),
    (lambda w: w["tensors"][0].update(shape=[-1, 3]), "shape"),
    (lambda w: w["tensors"][0]["thumb"].update(data=b"\\x00" * 3), "bytes of data"),
    (lambda w: w["tensors"][0]["thumb"].update(dtype="object"), "dtype 'object'"),
    (lambda w: w["nodes"][0].update(gi=[10_000]), "out of range"),
    (lambda w: w["edges"].append([0, 999, 0]), "edges"),
    (lambda w: w["tensors"][0].update(stats=[1.0, 2.0]), "stats"),
])
def test_malformed_traces_get_clear_errors(mutate: object, message: str) -> None:
    (st,) = _traced(name="mlp", steps=1)
    wire = step_to_wire(st)
    mutate(wire)  # type: ignore[operator]
    with pytest.raises(TraceFormatError, match=message):
        step_from_wire(wire)
