"""Cytoscape elements, colours, legend and search (`app.view.elements`) on real traces."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
import torch.nn as nn
from earlier_release import step_to_wire
from zoo import build

import gradscape
from gradscape.app.view import COLOR_BY, cytoscape_elements, find, layout_graph, legend, search, search_index


def zoo_wire(name: str) -> dict[str, Any]:
    case = build(name)
    tr = gradscape.Tracer(case.model, tensors="summary")
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    return step_to_wire(st)


class SqrtOfZero(nn.Module):
    """√ of an all-zero layer output: its derivative is +Inf, and Inf · 0 weights makes NaN further
    down, in the input and weight gradients of `fc`."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.out = nn.Linear(4, 1)
        nn.init.zeros_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.sqrt(self.fc(x)))


@pytest.fixture(scope="module")
def mlp() -> dict[str, Any]:
    return zoo_wire("mlp")


@pytest.fixture(scope="module")
def nan_wire() -> dict[str, Any]:
    torch.manual_seed(0)
    model = SqrtOfZero()
    x = torch.randn(5, 3, requires_grad=True)
    tr = gradscape.Tracer(model, tensors="summary")
    with tr.step(0) as st:
        model(x).sum().backward()
    assert torch.isnan(model.fc.weight.grad).any()  # the model really produced a NaN gradient
    return step_to_wire(st)


def by_id(elements: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["data"]["id"]: e for e in elements}


def arrived(wire: dict[str, Any], node_id: int) -> dict[str, Any]:
    return wire["tensors"][wire["nodes"][node_id]["go"][0]]


# ---------------------------------------------------------------------------- elements
def test_elements_cover_the_layout(mlp: dict[str, Any]) -> None:
    layout = layout_graph(mlp, set())
    elements = cytoscape_elements(mlp, layout)
    json.dumps(elements)  # what dash-cytoscape receives must be plain JSON
    els = by_id(elements)
    for eid, info in layout["nodes"].items():
        assert els[eid]["position"] == {"x": info["x"], "y": info["y"]}
    assert {e["data"]["id"] for e in elements if e["group"] == "edges"} == {e["id"] for e in layout["edges"]}
    assert all("source" not in e["data"] for e in elements if e["group"] == "nodes")
    seen: set[str] = set()
    for e in elements:  # a compound parent comes before what it contains
        parent = e["data"].get("parent")
        assert parent is None or parent in seen
        seen.add(e["data"]["id"])
    assert els["n5"]["data"]["parent"] == "g:fc2"
    assert els["g:fc2"]["classes"] == "module"


def test_labels_and_classes(mlp: dict[str, Any]) -> None:
    els = by_id(cytoscape_elements(mlp, layout_graph(mlp, set())))
    for n in mlp["nodes"]:
        e = els[f"n{n['id']}"]
        assert n["kind"] in e["classes"].split()
        if n["name"] == "AddmmBackward0":
            assert e["data"]["label"] == "Addmm"
        if n["param"] == "fc2.weight":
            assert e["data"]["label"] == "fc2.weight [30×20]"
    assert "root" in els["n0"]["classes"].split()  # NllLoss: where backward started
    assert not any("nan" in e["classes"].split() for e in els.values() if "classes" in e)


def test_collapsed_module_element(mlp: dict[str, Any]) -> None:
    layout = layout_graph(mlp, {"fc2"})
    els = by_id(cytoscape_elements(mlp, layout))
    m = els["m:fc2"]
    assert "collapsed" in m["classes"].split()
    assert m["data"]["count"] == 4  # Addmm, T and the two AccumulateGrad of fc2
    go = mlp["modules"]["fc2"]["calls"][0]["go"][0]
    assert m["data"]["value"] == pytest.approx(mlp["tensors"][go]["stats"][4])
    assert "n5" not in els and "g:fc2" not in els


# ---------------------------------------------------------------------------- colour
@pytest.mark.parametrize("color_by", COLOR_BY)
def test_colour_is_the_statistic_of_grad_outputs_0(mlp: dict[str, Any], color_by: str) -> None:
    els = by_id(cytoscape_elements(mlp, layout_graph(mlp, set()), color_by=color_by))
    for n in mlp["nodes"]:
        mn, mx, _, _, norm, _, _, zeros = arrived(mlp, n["id"])["stats"]
        numel = math.prod(arrived(mlp, n["id"])["shape"])
        expected = {"norm": norm, "maxabs": max(abs(mn), abs(mx)), "zeros": zeros / numel}[color_by]
        assert els[f"n{n['id']}"]["data"]["value"] == pytest.approx(expected)
        assert els[f"n{n['id']}"]["data"]["color"].startswith("#")


def test_colour_scale_is_ordered_and_the_legend_spans_the_nodes(mlp: dict[str, Any]) -> None:
    els = by_id(cytoscape_elements(mlp, layout_graph(mlp, set()), color_by="norm"))
    lg = legend(mlp, "norm")
    norms = [arrived(mlp, n["id"])["stats"][4] for n in mlp["nodes"]]
    assert lg["min"] == pytest.approx(math.log10(min(norms)))
    assert lg["max"] == pytest.approx(math.log10(max(norms)))
    assert lg["log"] and all(t["label"].startswith("1e") for t in lg["ticks"])
    smallest = min(mlp["nodes"], key=lambda n: arrived(mlp, n["id"])["stats"][4])
    largest = max(mlp["nodes"], key=lambda n: arrived(mlp, n["id"])["stats"][4])
    assert els[f"n{smallest['id']}"]["data"]["color"] == lg["colorscale"][0][1]
    assert els[f"n{largest['id']}"]["data"]["color"] == lg["colorscale"][-1][1]
    zeros = legend(mlp, "zeros")
    assert (zeros["min"], zeros["max"], zeros["log"]) == (0.0, 1.0, False)
    with pytest.raises(ValueError, match="color_by"):
        legend(mlp, "mean")


def test_nan_nodes_are_badged(nan_wire: dict[str, Any]) -> None:
    els = by_id(cytoscape_elements(nan_wire, layout_graph(nan_wire, set())))
    flagged = {e for e, el in els.items() if "nan" in el.get("classes", "").split()}
    expected = set()
    for n in nan_wire["nodes"]:
        ts = [nan_wire["tensors"][i] for i in (n["go"] or []) + (n["gi"] or []) if i is not None]
        if any(t["stats"][5] or t["stats"][6] for t in ts):
            expected.add(f"n{n['id']}")
    assert flagged == expected and expected
    weight = next(n["id"] for n in nan_wire["nodes"] if n["param"] == "fc.weight")
    assert els[f"n{weight}"]["data"]["badge"] == "NaN"
    sqrt = next(n["id"] for n in nan_wire["nodes"] if n["name"] == "SqrtBackward0")
    assert els[f"n{sqrt}"]["data"]["badge"] == "Inf"  # d√x/dx at 0
    folded = by_id(cytoscape_elements(nan_wire, layout_graph(nan_wire, {"fc"})))
    assert "nan" in folded["m:fc"]["classes"].split() and folded["m:fc"]["data"]["badge"] == "NaN/Inf"


def test_long_edges_carry_their_bends() -> None:
    wire = zoo_wire("transformer")
    layout = layout_graph(wire, set())
    els = by_id(cytoscape_elements(wire, layout))
    bent = [e for e in layout["edges"] if e["bends"]]
    assert bent  # the residual connections skip a branch
    for e in bent:
        data = els[e["id"]]["data"]
        s, t = layout["nodes"][e["source"]], layout["nodes"][e["target"]]
        vx, vy = t["x"] - s["x"], t["y"] - s["y"]
        length = math.hypot(vx, vy)
        for (px, py), d, w in zip(e["bends"], data["bend_d"], data["bend_w"]):
            # cytoscape's segments: P = S + w·(T−S) + d·(−vy, vx)/|T−S|
            assert s["x"] + w * vx - d * vy / length == pytest.approx(px, abs=0.05)
            assert s["y"] + w * vy + d * vx / length == pytest.approx(py, abs=0.05)


# ---------------------------------------------------------------------------- search
def test_search_index_and_find(mlp: dict[str, Any]) -> None:
    index = search_index(mlp)
    values = {o["value"] for o in index}
    assert {"m:fc1", "m:fc2", "m:fc3"} <= values
    assert {f"n{n['id']}" for n in mlp["nodes"]} <= values
    assert all(set(o) == {"label", "value"} for o in index)
    weight = next(n["id"] for n in mlp["nodes"] if n["param"] == "fc2.weight")
    assert find(mlp, "fc2") == "m:fc2"
    assert find(mlp, "fc2.weight") == f"n{weight}"
    assert find(mlp, "n7") == "n7" and find(mlp, "7") == "n7"
    first_addmm = min((n for n in mlp["nodes"] if n["name"] == "AddmmBackward0"), key=lambda n: n["order"])
    assert find(mlp, "Addmm") == find(mlp, "AddmmBackward0") == f"n{first_addmm['id']}"
    assert find(mlp, "relu") is not None and find(mlp, "no such thing") is None
    assert find(mlp, "n999") is None
    assert all("fc1" in o["label"] for o in search(mlp, "fc1"))


# ---------------------------------------------------------------------------- label contrast (WCAG AA)
def demo_wire(name: str) -> dict[str, Any]:
    """A step of the `gradscape demo` model `name`, traced as the demo does."""
    from gradscape.app import demo

    model, batch = demo.make(name)
    x, y = batch()
    tr = gradscape.Tracer(model, tensors="summary")
    with tr.step(0) as st:
        out = model(x)
        torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
    return step_to_wire(st)


def wcag(a: str, b: str) -> float:
    """WCAG 2 contrast ratio, computed here from the definition (not with the code under test)."""
    def lum(c: str) -> float:
        ch = [int(c[k:k + 2], 16) / 255 for k in (1, 3, 5)]
        lin = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in ch]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_every_label_reads_on_its_fill_in_every_colour_mode(name: str, nan_wire: dict[str, Any]) -> None:
    from gradscape.app.view.colours import PAGE_BACKGROUND

    wire = demo_wire(name)
    for w in (wire, nan_wire):
        for folded in (set(), None, {p for p in (w.get("modules") or {}) if p != "<root>" and "." not in p}):
            layout = layout_graph(w, folded)
            for color_by in COLOR_BY:
                for e in cytoscape_elements(w, layout, color_by):
                    if e["group"] != "nodes":
                        continue
                    d = e["data"]
                    behind = PAGE_BACKGROUND if "module" in e["classes"].split() else d["fill"]
                    assert wcag(d["text_color"], behind) >= 4.5, (name, color_by, d["label"], d["text_color"], behind)
                    if "nan" in e["classes"].split():
                        assert d["fill"] != d["color"]  # drawn red, and the label follows the red


def test_the_darkest_fill_gets_a_light_label() -> None:
    from gradscape.app.view.colours import SCALE, text_color

    assert text_color(SCALE[0]) == "#ffffff" and text_color(SCALE[-1]) == "#000000"
    assert min(max(wcag(c, "#000000"), wcag(c, "#ffffff")) for c in SCALE) >= 4.5


def test_folded_module_label_names_class_and_count() -> None:
    wire = demo_wire("transformer")
    layout = layout_graph(wire, {"encoder"})
    el = by_id(cytoscape_elements(wire, layout))["m:encoder"]
    assert el["data"]["label"].split("\n") == ["encoder", f"TransformerEncoder · {el['data']['count']} nodes"]
    assert el["data"]["w"] >= 13 * 0.6 * len("TransformerEncoder · 99 nodes")  # room for the longer line


def test_big_step_searches_on_the_server() -> None:
    from gradscape.app.view import SEARCH_HITS, searched_on_server
    from gradscape.app.view.search import SEARCH_ALL, SearchTable

    small = zoo_wire("mlp")
    assert not searched_on_server(small) and len(search_index(small)) > len(small["nodes"])
    big = {**small, "nodes": small["nodes"] * (SEARCH_ALL // len(small["nodes"]) + 1)}
    assert searched_on_server(big)
    first = search_index(big)
    assert len(first) == SEARCH_HITS and first[0]["value"].startswith("m:")
    # the same first options as sorting every one of them: modules outermost first, then parameters,
    # then the nodes in the order backward ran them
    every = SearchTable(big).options()  # every option, as a step under SEARCH_ALL nodes gets them
    every.sort(key=lambda o: (not o["value"].startswith("m:"), o["value"].count(".")))
    assert first == every[:SEARCH_HITS]
    assert any(o["label"].endswith("(parameter)") for o in first) and first[-1]["value"].startswith("n")
    assert search(big, "fc2.weight")  # everything stays findable by typing
