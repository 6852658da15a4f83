"""Gradient-flow charts (`app.view.flow`) against the gradients PyTorch left in `.grad`."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
import pytest
import torch
from earlier_release import step_to_wire
from zoo import build

import gradscape
from gradscape.app.view import flow_rows, gradient_flow, norm_over_steps
from gradscape.app.view.flow import ROW_PX, flow_height, short_names


def layer_grads(model: torch.nn.Module, layer: str) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.get_submodule(layer).parameters(recurse=False)])


def train(name: str, steps: int) -> tuple[list[dict[str, Any]], list[dict[str, torch.Tensor]], torch.nn.Module]:
    case = build(name)
    opt = torch.optim.SGD(case.model.parameters(), lr=0.5)
    tr = gradscape.Tracer(case.model, tensors="summary")
    wires, grads = [], []
    for i in range(steps):
        with tr.step(i) as st:
            case.loss(case.model, case.batch).backward()
        wires.append(step_to_wire(st))
        grads.append({m: layer_grads(case.model, m) for m in ("fc1", "fc2", "fc3")})
        opt.step()
        opt.zero_grad()
    return wires, grads, case.model


def test_gradient_flow_bars_are_rms_and_max_per_layer() -> None:
    (wire,), (grads,), _ = train("mlp", 1)
    fig = gradient_flow(wire)
    go.Figure(fig)
    max_bar, rms_bar = fig["data"]
    assert max_bar["y"] == rms_bar["y"] == ["fc1", "fc2", "fc3"]  # forward order, one row per layer
    assert max_bar["orientation"] == rms_bar["orientation"] == "h"
    for k, layer in enumerate(max_bar["y"]):
        g = grads[layer].double()
        assert rms_bar["x"][k] == pytest.approx(g.pow(2).mean().sqrt().item(), rel=1e-5)
        assert max_bar["x"][k] == pytest.approx(g.abs().max().item(), rel=1e-6)
    title = fig["layout"]["title"]["text"]
    assert "RMS" in title and "not recorded" in title and fig["layout"]["xaxis"]["type"] == "log"
    assert fig["layout"]["yaxis"]["autorange"] == "reversed"  # the input side at the top


def test_long_layer_names_are_shortened_and_whole_on_hover() -> None:
    """A GPT-2's layers (`transformer.h.0.attn.c_attn`, ...): labels without the prefix all share, one row of
    ROW_PX each (the chart grows with them), the full name in the hover text."""
    case = build("gpt2")
    with gradscape.Tracer(case.model, tensors="summary").step(0) as st:
        case.loss(case.model, case.batch).backward()
    wire = step_to_wire(st)
    layers = [r["layer"] for r in flow_rows(wire)]
    fig = gradient_flow(wire)
    bars = fig["data"][0]
    assert len(layers) == 27 and "transformer.h.0.attn.c_attn" in layers
    assert bars["y"] == [name.removeprefix("transformer.") for name in layers]
    assert len(set(bars["y"])) == len(layers)
    assert all(text.startswith(name + " (") for text, name in zip(bars["hovertext"], layers, strict=True))
    assert fig["layout"]["height"] == flow_height(27) >= 27 * ROW_PX
    assert short_names(["fc1", "fc2"]) == ["fc1", "fc2"] and short_names(["a.b"]) == ["a.b"]
    assert short_names(["m.a.x", "m.a"]) == ["a.x", "a"]  # never a name emptied


def test_forward_order_follows_execution_not_registration() -> None:
    case = build("transformer")
    tr = gradscape.Tracer(case.model, tensors="summary")
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    layers = [r["layer"] for r in flow_rows(step_to_wire(st))]
    assert layers[0] == "emb" and layers[-1] == "head"
    assert layers.index("attn") < layers.index("attn.out_proj") < layers.index("ln1")
    assert layers.index("ln1") < layers.index("ff.0") < layers.index("ff.2") < layers.index("ln2")


def test_norm_over_steps_tracks_each_layer() -> None:
    wires, grads, _ = train("mlp", 3)
    fig = norm_over_steps(list(reversed(wires)))  # any order in, steps sorted out
    go.Figure(fig)
    lines = {t["name"]: t for t in fig["data"]}
    assert list(lines) == ["fc1", "fc2", "fc3"]
    for layer, line in lines.items():
        assert line["x"] == [0, 1, 2]
        expected = [g[layer].double().norm().item() for g in grads]
        assert line["y"] == pytest.approx(expected, rel=1e-5)
    assert not math.isclose(lines["fc3"]["y"][0], lines["fc3"]["y"][2])  # training moved them


def test_log_axes_tick_powers_of_ten_over_whole_decades() -> None:
    wires, _, _ = train("mlp", 2)
    for fig, values in ((gradient_flow(wires[-1]), "x"), (norm_over_steps(wires), "y")):
        axis = fig["layout"][values + "axis"]
        assert axis["type"] == "log" and axis["dtick"] == 1 and axis["tickformat"] == ".0e"
        ys = [y for trace in fig["data"] for y in trace[values] if y]
        lo, hi = axis["range"]
        assert isinstance(lo, int) and isinstance(hi, int) and hi > lo
        assert 10 ** lo <= min(ys) and max(ys) <= 10 ** hi
        assert len(axis["title"]["text"]) <= 30  # a short title: it fits beside a 320 px chart
