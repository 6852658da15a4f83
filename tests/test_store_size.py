"""The trace file's size: compact thumbnails, the per-step thumbnail budget, version-2 files still read,
and `keep_last` (the file sink's and `gradscape serve --keep-last N`)."""

from __future__ import annotations

import math
import os
import sqlite3
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from earlier_release import step_to_wire, write_maps
from test_store import assert_same_step
from test_wire_columns import nodes_made

import gradscape
from gradscape import StoreError, TraceStore, load
from gradscape.app.view.heatmaps import slot_figures
from gradscape.tracer.sinks.file import FileSink
from gradscape.tracer.wire import TraceFormatError, compact, decode_array, encode_array, step_from_wire
from gradscape.tracer.wire.compact import ThumbTable, expand_all, quantise_same_shape


def _lstm_step(steps: int, path: Path | None = None, **opts: object) -> gradscape.StepTrace:
    """One traced step of an nn.LSTMCell unrolled `steps` times (about 15 nodes a time step), with a
    loss on every output, so that every gradient is non-zero."""
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(32, 32)
    x = torch.randn(steps, 8, 32)
    with gradscape.Tracer(cell, sink=None if path is None else str(path), run="lstm", **opts) as tr, \
            tr.step(0) as st:
        h = c = torch.zeros(8, 32)
        outs = []
        for t in range(steps):
            h, c = cell(x[t], (h, c))
            outs.append(h)
        torch.stack(outs).pow(2).mean().backward()
    assert st is not None
    return st


def _turned_back(c: dict[str, object]) -> np.ndarray:
    """A kept 8-bit thumbnail as the store reads it back."""
    return decode_array(expand_all([0], {0: c})[0], "t")


def _kept(a: np.ndarray) -> dict[str, object]:
    """A thumbnail as the store keeps it."""
    return quantise_same_shape(a.astype(np.float64)[None])[0]


def test_quantised_thumbnails_keep_their_range_and_non_finite_cells() -> None:
    a = np.array([[-2.0, 0.5, np.nan], [np.inf, -np.inf, 3.0]], dtype=np.float32)
    back = _turned_back(_kept(a))
    assert back.dtype == np.float32
    assert (back[0, 0], back[1, 2]) == (-2.0, 3.0)  # the extremes exactly
    assert np.isnan(back[0, 2]) and back[1, 0] == np.inf and back[1, 1] == -np.inf
    assert abs(back[0, 1] - 0.5) <= 5.0 / 252 / 2
    flat = np.full((3, 4), 7.25, dtype=np.float32)  # one value: no range at all
    assert np.array_equal(_turned_back(_kept(flat)), flat)


def test_thumbnails_quantised_together_equal_each_quantised_alone() -> None:
    """The store quantises a step's new thumbnails shape by shape in one pass (`quantise_same_shape`):
    each keeps its own range, whatever the others hold (NaN, ±Inf, one value, none finite, 1e-30..1e30,
    the float32 extremes)."""
    rng = np.random.default_rng(0)
    big = np.finfo(np.float32).max
    pics = [(rng.standard_normal((4, 6)) * 10.0 ** rng.integers(-30, 30)).astype(np.float32) for _ in range(40)]
    pics[3][1, 2] = np.nan
    pics[5][2] = np.inf
    pics[7][:] = np.nan
    pics[9][:] = 3.5
    pics[11][0, 0], pics[11][1, 1] = -np.inf, np.inf
    pics[13][:] = np.array([big, -big] * 3, dtype=np.float32)
    pics[15][:] = 0.0
    together = quantise_same_shape(np.stack(pics).astype(np.float64))
    alone = [quantise_same_shape(p.astype(np.float64)[None])[0] for p in pics]
    assert together == alone
    assert together[9]["lo"] == together[9]["hi"] == 3.5 and together[7]["q8"] == bytes([253]) * 24
    assert (together[13]["lo"], together[13]["hi"]) == (-float(big), float(big))
    for p, c in zip(pics, together):  # and within half a level of each picture, NaN/Inf kept
        back = _turned_back(c)
        fin, inf = np.isfinite(p), np.isinf(p)
        assert np.array_equal(np.isnan(back), np.isnan(p)) and np.array_equal(back[inf], p[inf])
        if fin.any() and np.isfinite(c["hi"] - c["lo"]):
            err = np.abs(back[fin].astype(np.float64) - p[fin])
            assert np.all(err <= (c["hi"] - c["lo"]) / 504 * 1.0001 + 1e-45)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_a_stack_of_finite_thumbnails_is_quantised_as_the_general_path_does(dtype: type) -> None:
    """A stack with no NaN or Inf takes `quantise_same_shape`'s shorter path (its range read in its own type,
    no masks): the same codes and ranges as the general path gives the same pictures in float64, across
    scales, one-value pictures, signed zeros, subnormals and the type's extremes."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((200, 5, 7)) * rng.choice([1e-30, 1e-5, 1.0, 1e4], size=(200, 1, 1))
    a[::7] = 3.0
    a[1::11, 0, 0] = -0.0
    a[2::13], a[2::13, 1, 1] = 0.0, -0.0
    a[3::17, 2] = rng.choice([1e-45, -1e-45, 0.0], size=7)
    a[4, 0, :2] = (np.finfo(dtype).max / 2, -np.finfo(dtype).max / 2)  # a range of the type's maximum
    v = a.astype(dtype)
    assert np.isfinite(v).all()

    def general(v: np.ndarray) -> list[dict[str, object]]:
        lo, hi, q = compact._quantise_general(v.astype(np.float64))
        return [{"q8": q[i].tobytes(), "shape": [5, 7], "lo": float(lo[i]), "hi": float(hi[i])} for i in range(len(v))]

    assert compact._quantise_finite(v) is not None and quantise_same_shape(v) == general(v)
    v[4, 0, :2] = (np.finfo(dtype).max, -np.finfo(dtype).max)  # a float64 range past a double's: the general rule
    assert (compact._quantise_finite(v) is None) == (dtype == np.float64) and quantise_same_shape(v) == general(v)
    v[9, 1, 1] = np.nan  # one NaN: the whole stack takes the general path
    assert quantise_same_shape(v)[9]["q8"][8] == 253


def test_thumbnails_turned_back_together_equal_each_turned_back_alone() -> None:
    """`expand_all` (the store's read) turns a step's 8-bit pictures back shape by shape in one pass: each
    equals its picture turned back alone, a repeat equals the picture it refers to (transposed where it
    says so), and a malformed row is named."""
    rng = np.random.default_rng(2)
    pics: list[np.ndarray | None] = [(rng.standard_normal((3, 5)) * 10.0 ** k).astype(np.float32) for k in range(-3, 4)]
    pics[2][0, 0], pics[4][1] = np.nan, -np.inf
    pics += [pics[1].copy(), np.ascontiguousarray(pics[3].T), np.full((2, 2), 7.0, np.float32), None]
    rows = dict(enumerate(ThumbTable().keep_all([None if p is None else encode_array(p) for p in pics])))
    assert rows[7] == {"same": 1, "T": False} and rows[8] == {"same": 3, "T": True} and rows[10] is None
    together = expand_all(list(rows), rows)
    for i, p in enumerate(pics):
        alone = expand_all([i], rows)[i]
        assert together[i] == alone
        if p is None:
            assert alone is None
            continue
        back = decode_array(alone, "t")
        assert back.shape == p.shape and np.array_equal(np.isnan(back), np.isnan(p))
        fin = np.isfinite(p)
        assert np.allclose(back[fin], p[fin], rtol=0, atol=float(np.ptp(p[fin])) / 500 + 1e-30)
    bad = {0: {"same": 5, "T": False}, 5: {"same": 0, "T": False}}
    with pytest.raises(TraceFormatError, match=r"tensors\[0\]\.thumb: refers to tensor 5"):
        expand_all([0], bad)
    short = {3: {**rows[0], "q8": rows[0]["q8"][:-1]}}
    with pytest.raises(TraceFormatError, match=r"tensors\[3\]\.thumb\.q8: expected 15 bytes"):
        expand_all([3], short)


def test_a_step_costs_few_bytes_a_node(tmp_path: Path) -> None:
    """A 3,000-node step of an unrolled LSTMCell: ~5 kB a node before thumbnails were kept in 8 bits
    and compressed; under 1 kB now with every thumbnail, and within 400 bytes a node when its
    thumbnail budget is 250 bytes a node. Statistics are always kept."""
    path, small = tmp_path / "all.sqlite", tmp_path / "budget.sqlite"
    st = _lstm_step(200, path)
    n = len(st.nodes)
    assert n > 2900 and "thumbs_left_out" not in st.meta
    assert os.path.getsize(path) / n < 1000
    cut = _lstm_step(200, small, thumb_budget=250 * n)
    assert os.path.getsize(small) / n <= 400
    back = load(small)
    assert back.meta["thumbs_left_out"]["count"] > 0
    assert all(t.stats for nd in back.nodes for t in (nd.grad_inputs or []) + (nd.grad_outputs or []) if t)
    assert_same_step(cut, back, stored=True)


def test_the_budget_leaves_out_the_smallest_norms_and_the_page_says_so(tmp_path: Path) -> None:
    st = _lstm_step(40)
    every = {id(t): t for nd in st.nodes for t in (nd.grad_inputs or []) + (nd.grad_outputs or []) if t}
    cells = sum(t.thumb.size for t in every.values() if t.thumb is not None)
    budget = cells // 3
    cut = _lstm_step(40, thumb_budget=budget)
    tensors = {id(t): t for nd in cut.nodes for t in (nd.grad_inputs or []) + (nd.grad_outputs or []) if t}
    kept = [t for t in tensors.values() if t.thumb is not None]
    out = [t for t in tensors.values() if t.thumb is None]
    assert kept and out and sum(t.thumb.size for t in kept) <= budget  # type: ignore[union-attr]
    assert min(t.stats["norm"] for t in kept) >= max(t.stats["norm"] for t in out)
    info = cut.meta["thumbs_left_out"]
    assert info["budget"] == budget and info["count"] == len(out)
    assert info["max_norm"] == max(t.stats["norm"] for t in out)
    wire = step_to_wire(cut)
    node = next(nd for nd in cut.nodes if nd.grad_outputs and nd.grad_outputs[0] is not None
                and nd.grad_outputs[0].thumb is None)
    w = step_to_wire(cut)
    idx = w["nodes"][node.id]["go"][0]
    arrays = {i: {"thumb": t["thumb"], "values": t["values"]} for i, t in enumerate(wire["tensors"])}
    note = slot_figures(w, node.id, arrays)["grad_outputs"]["slots"][0]["note"]
    assert idx is not None and "left out" in note and str(budget) in note
    with pytest.raises(ValueError, match="thumb_budget"):
        gradscape.Tracer(thumb_budget=-1)


def test_a_loaded_step_has_the_thumbnails_the_page_reads(tmp_path: Path) -> None:
    """`read_step` turns thumbnails straight into arrays, `read_arrays` (the page's) into wire arrays:
    both give the same pictures, repeats and transposes (NOTE [Compact thumbnails]) included."""
    path = tmp_path / "t.sqlite"
    _lstm_step(30, path)
    with TraceStore(path, readonly=True) as store:
        st = store.read_step("lstm", 0)
        graph = store.read_graph("lstm", 0)  # the stored numbering of tensors, which the page asks by
        arrays = store.read_arrays("lstm", 0, range(len(graph["tensors"])))
    pictures = 0
    for node, wire in zip(st.nodes, graph["nodes"], strict=True):
        for t, i in zip([*(node.grad_outputs or []), *(node.grad_inputs or [])], [*(wire["go"] or []),
                                                                                 *(wire["gi"] or [])], strict=True):
            page = None if i is None else arrays.get(i, {"thumb": None})["thumb"]
            assert (t is None or t.thumb is None) == (page is None), (node.id, i)
            if page is not None:
                assert encode_array(t.thumb) == page, (node.id, i)  # dtype, shape and bytes
                pictures += 1
    assert pictures > 100
    with sqlite3.connect(path) as db:
        repeats = sum(b'same' in blob for (blob,) in db.execute("SELECT arrays FROM tensors"))
    assert repeats > 0  # the step has thumbnails kept as references to others


@pytest.mark.parametrize("tensors", ["summary", "full"])
def test_a_step_is_stored_alike_from_its_trace_and_from_its_wire_form(tmp_path: Path, tensors: str) -> None:
    """`write_step` keeps the arrays apart without making wire arrays of them. As columns (NOTE [Column
    document]), from the native recorder's tables or from the step's `NodeTrace`s (NOTE [Columns of any
    step]), it stores the same tensor rows, row for row and byte for byte, as the server stores from the maps
    form, and a document that reads back the same."""
    st = _lstm_step(30, tensors=tensors)
    paths = {form: tmp_path / f"{form}.sqlite" for form in ("columns", "nodes", "wire")}
    for form, path in paths.items():
        with TraceStore(path) as store:
            if form == "wire":
                write_maps(store, step_to_wire(st))
            else:
                store.write_step(st if form == "columns" else nodes_made(st))
    rows = {}
    for form, path in paths.items():
        with sqlite3.connect(path) as db:
            rows[form] = (db.execute("SELECT run, rank, step, n_nodes, n_edges, error, graph FROM steps").fetchall(),
                          db.execute("SELECT * FROM tensors ORDER BY idx").fetchall())
    for form in ("columns", "nodes"):
        assert rows[form][0][0][:6] == rows["wire"][0][0][:6]  # the same counts, another document
        assert rows[form][1] == rows["wire"][1]  # the same tensor rows: numbered alike
    assert len(rows["wire"][1]) > 100 and any(b"same" in blob for *_, blob in rows["wire"][1])
    assert (tensors == "full") == any(b"values" in blob and b"<f4" in blob for *_, blob in rows["wire"][1])
    back = {form: step_to_wire(load(path)) for form, path in paths.items()}
    assert back["columns"] == back["nodes"] == back["wire"]


def test_arrays_for_a_tensor_the_step_does_not_have_are_refused(tmp_path: Path) -> None:
    wire = step_to_wire(_lstm_step(2))
    n = len(wire["tensors"])
    with pytest.raises(TraceFormatError, match=f"tensor {n} is not one of the step's {n}"):
        step_from_wire(wire, {n: (None, None)})
    path = tmp_path / "extra.sqlite"  # a file with a row for a tensor past the step's: `load` names it
    _lstm_step(2, path)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO tensors VALUES('lstm', 0, 0, ?, ?)",
                   (n, msgpack.packb({"thumb": None, "values": None}, use_bin_type=True)))
    with pytest.raises(StoreError, match=f"tensor {n} is not one of the step's {n}"):
        load(path)


def test_a_version_2_file_still_reads(tmp_path: Path) -> None:
    """Version 2 kept uncompressed blobs and float32 thumbnails: such a file reads exactly, and opening
    it for writing marks it version 3 without rewriting it."""
    path = tmp_path / "v2.sqlite"
    st = _lstm_step(3, path)
    db = sqlite3.connect(path)
    wire = step_to_wire(st)
    graph = {**wire, "tensors": [{k: t[k] for k in ("shape", "dtype", "stats", "view", "device")}  # type: ignore[literal-required]
                                 for t in wire["tensors"]]}
    db.execute("UPDATE steps SET graph=?", (msgpack.packb(graph, use_bin_type=True),))
    db.execute("DELETE FROM tensors")
    db.executemany("INSERT INTO tensors VALUES('lstm', 0, 0, ?, ?)",
                   [(i, msgpack.packb({"thumb": t["thumb"], "values": t["values"]}, use_bin_type=True))
                    for i, t in enumerate(wire["tensors"])])
    db.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
    db.commit()
    db.close()
    assert_same_step(st, load(path))  # exactly: version 2 kept float32
    with TraceStore(path) as store:
        store.write_step(_lstm_step(2))
        assert [s["step"] for s in store.steps("lstm")] == [0]  # the same step 0, replaced
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "5"


def test_keep_last_keeps_the_newest_steps(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    sink = FileSink(path, keep_last=2)
    cell = torch.nn.Linear(3, 2)
    tr = gradscape.Tracer(cell, sink=[sink], run="r")
    for i in range(5):
        with tr.step(i):
            cell(torch.randn(4, 3)).sum().backward()
    tr.close()
    with TraceStore(path, readonly=True) as store:
        assert [s["step"] for s in store.steps("r")] == [3, 4]
    db = sqlite3.connect(path)
    assert {s for (s,) in db.execute("SELECT DISTINCT step FROM tensors")} == {3, 4}
    with pytest.raises(ValueError, match="keep_last"):
        TraceStore(tmp_path / "x.sqlite", keep_last=0)
    assert math.isfinite(load(path).nodes[0].grad_outputs[0].stats["norm"])  # type: ignore[index,union-attr]


def test_serve_keep_last_is_a_store_option(tmp_path: Path) -> None:
    from gradscape.app.cli import main
    from gradscape.app.server import ServerConfig, create_app

    app = create_app(str(tmp_path / "s.sqlite"), ServerConfig(keep_last=3))
    try:
        assert app.state.store.keep_last == 3
    finally:
        app.close()
    with pytest.raises(SystemExit):  # argparse: "expected a positive number of steps"
        main(["serve", "--keep-last", "0"])


_DEEP = """
import sys, time, torch, gradscape
torch.set_num_threads(1)
assert sys.getrecursionlimit() == 1000  # the interpreter's default: nothing here may recurse per node
cell = torch.nn.LSTMCell(32, 32)
x = torch.randn(6666, 8, 32)
def loss():  # the graph is the function's: it is freed before the step ends (NOTE [Teardown] in tracer/record/walk.py)
    h = c = torch.zeros(8, 32)
    for t in range(6666):
        h, c = cell(x[t], (h, c))
    return h.pow(2).mean()
with gradscape.Tracer(cell, sink=sys.argv[1], run="deep") as tr, tr.step(0) as st:
    loss().backward()
back = gradscape.load(sys.argv[1])
assert len(back.nodes) == len(st.nodes) > 99_000, len(back.nodes)
assert back.edges == st.edges
print("ok", len(back.nodes))
"""


@pytest.mark.slow
def test_a_100k_node_step_is_traced_written_and_read_back_with_default_limits(tmp_path: Path) -> None:
    """A deep graph is a loop over a long sequence, not an error: 6,666 LSTMCell steps (~100k nodes)
    traced, written and read back in a fresh interpreter with the default recursion limit and stack."""
    import subprocess
    import sys

    path = tmp_path / "deep.sqlite"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", _DEEP, str(path)], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[0] == "ok"


def _repeats_one_by_one(pictures: list[np.ndarray | None]) -> dict[int, tuple[int, bool] | None]:
    """The rule of `repeats`, picture by picture: a dict of the kept pictures' bytes."""
    seen: dict[tuple[bytes, tuple[int, ...]], int] = {}
    out: dict[int, tuple[int, bool] | None] = {}
    for i, a in enumerate(pictures):
        if a is None:
            continue
        k = seen.get((a.tobytes(), a.shape))
        if k is None and a.shape[0] > 1 and a.shape[1] > 1:
            t = np.ascontiguousarray(a.T)
            kt = seen.get((t.tobytes(), t.shape))
            out[i] = None if kt is None else (kt, True)
        else:
            out[i] = None if k is None else (k, False)
        if out[i] is None:
            seen[(a.tobytes(), a.shape)] = i
    return out


def test_repeated_pictures_are_found_as_one_by_one() -> None:
    """`repeats` (numpy over every picture of a shape at once) against the rule applied one picture at a
    time: repeats, transposes of kept pictures and of repeats, symmetric pictures, NaN, -0.0 against 0.0,
    3x5 against 5x3, 1xN (never a transpose), in a random order."""
    rng = np.random.default_rng(7)
    base = [rng.standard_normal(s).astype(np.float32) for s in [(3, 5), (5, 3), (4, 4), (1, 6), (4, 4)]]
    base[2][1, 1] = np.nan
    sym = np.ones((4, 4), np.float32)
    zero, neg = np.zeros((4, 4), np.float32), np.full((4, 4), -0.0, np.float32)
    pool = base + [sym, zero, neg] + [np.ascontiguousarray(b.T) for b in base if b.shape[0] > 1]
    pictures: list[np.ndarray | None] = [None if k % 11 == 0 else pool[int(rng.integers(len(pool)))].copy()
                                         for k in range(400)]
    from gradscape.tracer.wire.compact import repeats

    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, a in enumerate(pictures):
        if a is not None:
            by_shape.setdefault(a.shape, []).append(i)
    stacks = {s: np.stack([pictures[i] for i in ix]) for s, ix in by_shape.items()}  # type: ignore[misc]
    want = _repeats_one_by_one(pictures)
    assert repeats(by_shape, stacks) == want
    assert sum(v is not None and v[1] for v in want.values()) > 20  # transposes were found
    kept = ThumbTable().keep_arrays(pictures)
    for i, v in want.items():
        assert (kept[i] == {"same": v[0], "T": v[1]}) if v is not None else ("q8" in kept[i]), i  # type: ignore[operator]
