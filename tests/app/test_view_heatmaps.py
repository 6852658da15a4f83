"""Inspector heatmaps, statistics and explanations (`app.view.heatmaps`) on real traces, read back
through a real trace file the way the UI reads them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
import torch.nn as nn
from earlier_release import step_to_wire
from zoo import build

import gradscape
from gradscape.app.view import explain, node_tensors, slot_figures
from gradscape.app.view.grid import block_edges
from gradscape.app.view.heatmaps import ARRIVING, SENT
from gradscape.tracer.wire import decode_array

Store = tuple[gradscape.TraceStore, str, int]


def traced_store(tmp_path: Path, name: str, tensors: str) -> Store:
    """Trace a zoo model into a real SQLite trace file; the UI reads graph and arrays from it."""
    case = build(name)
    path = tmp_path / f"{name}-{tensors}.sqlite"
    with gradscape.Tracer(case.model, sink=str(path), run=name, tensors=tensors) as tr, tr.step(0):
        case.loss(case.model, case.batch).backward()
    return gradscape.TraceStore(path, readonly=True), name, 0


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def mlp_full(store_dir: Path) -> Store:
    return traced_store(store_dir, "mlp", "full")


def panel(store: Store, node: int, **kw: Any) -> tuple[dict[str, Any], dict[str, Any], dict[int, Any]]:
    db, run, step = store
    wire = db.read_graph(run, step)
    arrays = db.read_arrays(run, step, node_tensors(wire, node))
    return wire, slot_figures(wire, node, arrays, **kw), arrays


def all_slots(fig: dict[str, Any]) -> list[dict[str, Any]]:
    return fig["grad_outputs"]["slots"] + fig["grad_inputs"]["slots"]


def z_of(slot: dict[str, Any]) -> np.ndarray:
    z = slot["figure"]["data"][0]["z"]
    return np.array([[np.nan if v is None else v for v in row] for row in z], dtype=np.float64)


def expected_view(values: np.ndarray, sample: int = 0) -> np.ndarray:
    """NOTE [Thumbnail views], written out independently of the code under test."""
    v = values.astype(np.float64)
    if v.ndim == 4:
        c, h, w = v.shape[1:]
        cols = math.ceil(math.sqrt(c))
        rows = math.ceil(c / cols)
        out = np.full((rows * h, cols * w), np.nan)
        for k in range(c):
            i, j = divmod(k, cols)
            out[i * h:(i + 1) * h, j * w:(j + 1) * w] = v[sample, k]
        return out
    if v.ndim <= 1:
        return v.reshape(1, -1)
    return v.reshape(-1, v.shape[-1])


# ---------------------------------------------------------------------------- values
def test_full_values_are_shown_exactly(mlp_full: Store) -> None:
    db, run, step = mlp_full
    wire = db.read_graph(run, step)
    assert all("values" not in t for t in wire["tensors"])  # the graph comes without arrays
    for node in wire["nodes"]:
        _, fig, arrays = panel(mlp_full, node["id"])
        for slot in all_slots(fig):
            if slot["tensor"] is None:
                assert slot["figure"] is None and "None" in slot["note"]
                continue
            values = decode_array(arrays[slot["tensor"]]["values"])
            assert slot["source"] == "full values"
            assert list(values.shape) == slot["shape"]
            np.testing.assert_array_equal(z_of(slot), expected_view(values))


@pytest.mark.parametrize("name", ["transformer", "cnn"])
def test_full_values_of_3d_and_4d_gradients(store_dir: Path, name: str) -> None:
    store = traced_store(store_dir, name, "full")
    wire = store[0].read_graph(store[1], store[2])
    ranks = set()
    for node in wire["nodes"]:
        _, fig, arrays = panel(store, node["id"], sample=1)
        for slot in all_slots(fig):
            if slot["figure"] is None:
                continue
            values = decode_array(arrays[slot["tensor"]]["values"])
            ranks.add(values.ndim)
            np.testing.assert_array_equal(z_of(slot), expected_view(values, sample=1 if values.ndim == 4 else 0))
            if values.ndim == 4:
                assert slot["view"].startswith(f"sample 1 of {values.shape[0]}")
    assert {"transformer": 3, "cnn": 4}[name] in ranks  # [B, T, d] activations; conv [N, C, H, W]


def test_summary_mode_shows_the_thumbnail(store_dir: Path) -> None:
    store = traced_store(store_dir, "cnn", "summary")
    wire = store[0].read_graph(store[1], store[2])
    shown = 0
    for node in wire["nodes"]:
        _, fig, arrays = panel(store, node["id"])
        for slot in all_slots(fig):
            if slot["figure"] is None:
                continue
            thumb = decode_array(arrays[slot["tensor"]]["thumb"])
            assert arrays[slot["tensor"]]["values"] is None
            assert slot["source"].startswith(("thumbnail: block means of", "thumbnail: every value"))
            np.testing.assert_array_equal(z_of(slot), thumb.astype(np.float64))
            shown += 1
    assert shown > 10


def test_big_gradient_thumbnail_says_how_much_it_averages(tmp_path: Path) -> None:
    model = nn.Linear(300, 200)
    path = tmp_path / "big.sqlite"
    with gradscape.Tracer(model, sink=str(path), run="big") as tr, tr.step(0):
        model(torch.randn(8, 300)).sum().backward()
    db = gradscape.TraceStore(path, readonly=True)
    wire = db.read_graph("big", 0)
    weight = next(n["id"] for n in wire["nodes"] if n["param"] == "weight")
    fig = slot_figures(wire, weight, db.read_arrays("big", 0, node_tensors(wire, weight)))
    slot = fig["grad_outputs"]["slots"][0]
    assert slot["shape"] == [200, 300]
    assert slot["source"] == "thumbnail: block means of 4×5 elements"  # 200/64 → 4 rows, 300/64 → 5 cols
    assert z_of(slot).shape == (50, 60)


def test_big_full_gradient_is_block_averaged_to_fit(tmp_path: Path) -> None:
    model = nn.Linear(300, 200)
    tr = gradscape.Tracer(model, tensors="full")
    with tr.step(0) as st:
        model(torch.randn(8, 300)).sum().backward()
    wire = step_to_wire(st)
    weight = next(n["id"] for n in wire["nodes"] if n["param"] == "weight")
    arrays = {i: wire["tensors"][i] for i in node_tensors(wire, weight)}
    slot = slot_figures(wire, weight, arrays, max_side=128)["grad_outputs"]["slots"][0]
    g = model.weight.grad.double().numpy()
    assert slot["source"] == "full values, block means"
    assert slot["view"] == "rows 200 × cols 300 (block means of 2×3)"
    np.testing.assert_allclose(z_of(slot), g.reshape(100, 2, 100, 3).mean(axis=(1, 3)), rtol=1e-6)


# ---------------------------------------------------------------------------- figures
def test_colour_scale_is_diverging_and_symmetric(mlp_full: Store) -> None:
    wire, fig, _ = panel(mlp_full, 2)  # AddmmBackward0 of fc3
    for slot in all_slots(fig):
        go.Figure(slot["figure"])  # a valid plotly figure
        trace = slot["figure"]["data"][0]
        m = np.nanmax(np.abs(z_of(slot)))
        assert trace["colorscale"] == "RdBu_r" and trace["zmid"] == 0
        assert trace["zmax"] == pytest.approx(m) and trace["zmin"] == -trace["zmax"]


def test_slots_are_labelled_from_the_node(mlp_full: Store) -> None:
    wire, fig, _ = panel(mlp_full, 5)  # AddmmBackward0 of fc2
    node = wire["nodes"][5]
    assert fig["grad_outputs"]["title"] == ARRIVING and fig["grad_inputs"]["title"] == SENT
    sent = fig["grad_inputs"]["slots"]
    assert [s["label"] for s in sent] == node["labels"]
    assert sent[2]["label"] == "mat2 → fc2.weight (transposed)"
    assert sent[2]["title"] == "mat2 → fc2.weight (transposed) · [20×30] float32"
    assert sent[2]["figure"]["layout"]["title"]["text"].startswith(sent[2]["title"])
    assert [row["stat"] for row in sent[0]["stats"]] == ["min", "max", "mean", "std", "norm", "nan", "inf", "zeros%"]
    stats = wire["tensors"][node["gi"][0]]["stats"]
    assert sent[0]["stats"][4]["value"] == pytest.approx(stats[4])


def test_stats_match_the_real_gradient() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    x = torch.randn(10, 4)
    tr = gradscape.Tracer(model, tensors="full")
    with tr.step(0) as st:
        model(x).pow(2).mean().backward()
    wire = step_to_wire(st)
    node = next(n for n in wire["nodes"] if n["param"] == "0.weight")
    arrays = {i: wire["tensors"][i] for i in node_tensors(wire, node["id"])}
    slot = slot_figures(wire, node["id"], arrays)["grad_outputs"]["slots"][0]
    g = model[0].weight.grad.double()
    rows = {r["stat"]: r["value"] for r in slot["stats"]}
    assert rows["norm"] == pytest.approx(g.norm().item(), rel=1e-5)
    assert rows["max"] == pytest.approx(g.max().item(), rel=1e-5)
    assert rows["zeros%"] == pytest.approx(100.0 * (g == 0).sum().item() / g.numel())
    np.testing.assert_array_equal(z_of(slot), g.float().numpy().astype(np.float64))


def test_nan_and_inf_cells_are_drawn(tmp_path: Path) -> None:
    class SqrtOfZero(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 4)
            nn.init.zeros_(self.fc.weight)
            nn.init.zeros_(self.fc.bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sqrt(self.fc(x)).sum()

    model = SqrtOfZero()
    tr = gradscape.Tracer(model, tensors="full")
    with tr.step(0) as st:
        model(torch.randn(5, 3)).backward()
    wire = step_to_wire(st)
    sqrt = next(n for n in wire["nodes"] if n["name"] == "SqrtBackward0")
    arrays = {i: wire["tensors"][i] for i in node_tensors(wire, sqrt["id"])}
    slot = slot_figures(wire, sqrt["id"], arrays)["grad_inputs"]["slots"][0]
    main, marks = slot["figure"]["data"]
    assert all(v is None for row in main["z"] for v in row)  # every cell is +Inf: nothing finite to colour
    assert {v for row in marks["z"] for v in row} == {2.0}  # … and all are marked +Inf
    assert main["zmin"] == -main["zmax"]
    assert {r["stat"]: r["value"] for r in slot["stats"]}["inf"] == 20


# ---------------------------------------------------------------------------- explain
def test_explain_uses_the_real_shapes(mlp_full: Store) -> None:
    wire = mlp_full[0].read_graph(mlp_full[1], mlp_full[2])
    assert explain(wire, 5) == (
        "grad_inputs[j] = J_jᵀ · grad_outputs: AddmmBackward0 received ∂L/∂output [8×30] and sent "
        "∂L/∂self [30], ∂L/∂mat1 [8×20], ∂L/∂mat2 [20×30] (a vector-Jacobian product)")
    first = explain(wire, 8)  # fc1: its input needs no gradient
    assert "nothing for mat1 (no gradient needed)" in first and "∂L/∂mat2 [3×20]" in first
    weight = next(n["id"] for n in wire["nodes"] if n["param"] == "fc2.weight")
    assert explain(wire, f"n{weight}") == "this is the parameter's .grad contribution: fc2.weight [30×20]"
    assert "(the seed passed to backward)" in explain(wire, 0)


# ---------------------------------------------------------------------------- positions
def test_block_edges_follow_the_thumbnail_rule() -> None:
    assert block_edges(128, 64) == list(range(0, 129, 2))
    assert block_edges(5, 5) == [0, 1, 2, 3, 4, 5]
    # 200 rows in 50 cells: 4 each; 130 rows shown in 44 cells: 3 each, the last holds one row only
    assert block_edges(200, 50)[-2:] == [196, 200]
    e = block_edges(130, 44)
    assert len(e) == 45 and e[1] == 3 and e[-2:] == [129, 130]
    t = torch.arange(130.0)
    from gradscape.tracer.summary.thumbnails import _block_mean
    means = _block_mean(t, 0, 64)  # what the tracer's thumbnail holds, cell by cell
    assert means.shape[0] == 44
    for i in range(44):
        assert means[i].item() == pytest.approx(t[e[i]:e[i + 1]].mean().item())


def test_thumbnail_axes_count_tensor_rows(tmp_path: Path) -> None:
    """A 128×32 gradient shown from its 64×32 thumbnail: the y axis runs over the tensor's 128 rows,
    each cell names the two rows it averages and holds their mean."""
    model = nn.Linear(32, 128, bias=False)
    path = tmp_path / "tall.sqlite"
    with gradscape.Tracer(model, sink=str(path), run="tall") as tr, tr.step(0):
        model(torch.randn(4, 32)).pow(2).sum().backward()
    db = gradscape.TraceStore(path, readonly=True)
    wire = db.read_graph("tall", 0)
    weight = next(n["id"] for n in wire["nodes"] if n["param"] == "weight")
    slot = slot_figures(wire, weight, db.read_arrays("tall", 0, node_tensors(wire, weight)))["grad_outputs"]["slots"][0]
    trace = slot["figure"]["data"][0]
    assert slot["shape"] == [128, 32] and z_of(slot).shape == (64, 32)
    assert trace["y"][0] == -0.5 and trace["y"][-1] == 127.5 and len(trace["y"]) == 65
    assert trace["x"][-1] == 31.5
    g = model.weight.grad.double().numpy()
    assert trace["text"][1][3].startswith("rows 2–3, col 3: mean of 2 elements<br>")
    # a stored thumbnail is kept in 8 bits with its range (tracer/wire/compact.py): a cell is within
    # (hi - lo) / 504 of the block mean, plus the hover text's 4 significant digits
    means = g.reshape(64, 2, 32).mean(axis=1)
    bound = (means.max() - means.min()) / 504
    assert float(trace["text"][1][3].split("<br>")[1]) == pytest.approx(g[2:4, 3].mean(), abs=bound, rel=1e-3)
    assert trace["hovertemplate"] == "%{text}<extra></extra>"


def test_full_values_hover_gives_exact_index_and_value(mlp_full: Store) -> None:
    _, fig, arrays = panel(mlp_full, 5)
    slot = fig["grad_inputs"]["slots"][2]  # [20×30], shown cell by cell
    trace = slot["figure"]["data"][0]
    assert "x" not in trace and "y" not in trace and "text" not in trace  # cells at their own indices
    assert trace["hovertemplate"] == "row %{y}, col %{x}<br>%{z:.9g}<extra></extra>"


def test_3d_rows_name_their_leading_indices(store_dir: Path) -> None:
    store = traced_store(store_dir, "transformer", "full")
    wire = store[0].read_graph(store[1], store[2])
    found = 0
    for node in wire["nodes"]:
        _, fig, _ = panel(store, node["id"])
        for slot in all_slots(fig):
            if slot["figure"] is None or len(slot["shape"]) != 3:
                continue
            b, t, d = slot["shape"]
            text = slot["figure"]["data"][0]["text"]
            assert text[t + 1][2].startswith(f"row {t + 1} = [1, 1, :], col 2<br>")
            found += 1
    assert found


def test_4d_cells_name_sample_channel_row_and_col(store_dir: Path) -> None:
    store = traced_store(store_dir, "cnn", "full")
    wire = store[0].read_graph(store[1], store[2])
    for node in wire["nodes"]:
        _, fig, arrays = panel(store, node["id"], sample=1)
        for slot in all_slots(fig):
            if slot["figure"] is None or len(slot["shape"]) != 4:
                continue
            n, c, h, w = slot["shape"]
            values = decode_array(arrays[slot["tensor"]]["values"])
            text = slot["figure"]["data"][0]["text"]
            want = f"sample 1, channel 0, row {h - 1}, col {w - 1}<br>{float(values[1, 0, h - 1, w - 1]):.9g}"
            assert text[h - 1][w - 1] == want
            return
    raise AssertionError("no 4-D gradient in the cnn trace")
