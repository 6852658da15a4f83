"""A module called many times opens into its calls (`app.view.calls`, `call_folds`, `folds`): on real traces
of an LSTMCell loop, which nodes each call made, the fold tokens, and what a click on each fold draws."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from earlier_release import step_to_wire
from test_view_fit import Loop, Wrapped, loop_wire
from torch import nn

import gradscape
from gradscape.app.view import after_tap, cytoscape_elements, layout_graph, open_module, reveal_node
from gradscape.app.view.call_folds import CALLS_SHOWN, CallView, fold_tokens, split_folds
from gradscape.app.view.calls import call_members
from gradscape.app.view.ids import call_element, call_of, more_element
from gradscape.app.view.layered import ProperGraph

STEPS = 120


@pytest.fixture(scope="module")
def loop() -> dict[str, Any]:
    return loop_wire(Loop(), steps=STEPS)


def opening(wire: dict[str, Any]) -> list[str]:
    return layout_graph(wire, None)["collapsed"]


def test_each_call_of_the_loop_holds_its_own_ops_and_the_weights_belong_to_the_module(loop: dict[str, Any]) -> None:
    found = call_members(loop, "cell")
    assert len(found.calls) == STEPS
    sizes = {len(c) for c in found.calls}
    assert sizes == {len(found.calls[0])} and len(found.calls[0]) >= 10  # the same ops in every call
    # every node of the cell is in one call or the module's own (its four parameters' AccumulateGrad)
    cell_nodes = [n["id"] for n in loop["nodes"]
                  if (n["module"] or "") == "cell" or (n["param"] or "").startswith("cell.")]
    flat = [n for c in found.calls for n in c]
    assert len(flat) == len(set(flat)) and sorted(flat + found.loose) == sorted(cell_nodes)
    assert sorted(loop["nodes"][n]["param"] for n in found.loose) == \
        ["cell.bias_hh", "cell.bias_ih", "cell.weight_hh", "cell.weight_ih"]
    for k, call in enumerate(loop["modules"]["cell"]["calls"]):  # a call's outputs are its own
        assert {n for n in call["out"] if n is not None} <= set(found.calls[k])


def test_the_fold_tokens_read_back() -> None:
    folds, views = split_folds(["head", "cell#calls=100", "cell#call=17", "cell#call=3"])
    assert folds == {"head"} and views == {"cell": CallView(100, {3, 17})}
    assert fold_tokens(folds, views) == ["cell#call=17", "cell#call=3", "cell#calls=100", "head"]
    assert split_folds(["enc.cell#call=2"])[1]["enc.cell"].shown == CALLS_SHOWN


def _ids(ranges: list[list[int]]) -> list[int]:
    return [n for a, b in ranges for n in range(a, b + 1)]


def test_a_click_on_the_folded_loop_draws_its_first_calls_folded_and_a_more_node(loop: dict[str, Any]) -> None:
    start = opening(loop)
    assert "cell" in start
    folds = after_tap(loop, start, "m:cell")
    assert folds is not None and "cell" not in folds and f"cell#calls={CALLS_SHOWN}" in folds
    lay = layout_graph(loop, folds, max_drawn=300)
    calls = [e for e in lay["nodes"] if call_of(e) is not None]
    assert len(calls) == CALLS_SHOWN + 1 and more_element("cell") in calls
    assert lay["nodes"][call_element("cell", 17)]["label"].startswith(f"cell · call 17 of {STEPS}\nLSTMCell · ")
    assert lay["nodes"][call_element("cell", 17)]["parent"] == "cell" and "cell" in lay["boxes"]
    assert lay["refolded"] == [] and lay["collapsed"] == folds
    # what the page draws: each call's node, labelled, coloured, its members for the player
    els = {e["data"]["id"]: e for e in cytoscape_elements(loop, lay)}
    c17 = els[call_element("cell", 17)]
    assert "call" in c17["classes"] and _ids(c17["data"]["ranges"]) == call_members(loop, "cell").calls[16]
    more = els[more_element("cell")]
    # the calls not drawn yet hold every node of those calls, for the player
    assert "more" in more["classes"] and _ids(more["data"]["ranges"]) == sorted(
        n for c in call_members(loop, "cell").calls[CALLS_SHOWN:] for n in c)
    assert els[more_element("cell")]["data"]["label"].startswith(f"cell · calls {CALLS_SHOWN + 1}–{STEPS}")


def test_a_call_opens_into_its_ops_and_more_draws_the_next_calls(loop: dict[str, Any]) -> None:
    folds = after_tap(loop, opening(loop), "m:cell")
    assert folds is not None
    opened = after_tap(loop, folds, call_element("cell", 17))
    assert opened is not None and "cell#call=17" in opened
    lay = layout_graph(loop, opened, max_drawn=300)
    assert call_element("cell", 17) not in lay["nodes"]
    assert all(f"n{n}" in lay["nodes"] for n in call_members(loop, "cell").calls[16])
    # in a box of its own inside the loop's, which folds that call back alone
    assert {lay["nodes"][f"n{n}"]["parent"] for n in call_members(loop, "cell").calls[16]} == {"cell#17"}
    assert lay["boxes"]["cell#17"] == "cell" and lay["box_labels"]["cell#17"] == f"cell · call 17 of {STEPS}"
    two = after_tap(loop, opened, call_element("cell", 20))
    assert two is not None and after_tap(loop, two, "g:cell#17") == sorted(f for f in two if f != "cell#call=17")
    more = after_tap(loop, opened, more_element("cell"))
    assert more is not None and f"cell#calls={2 * CALLS_SHOWN}" in more and "cell#call=17" in more
    lay = layout_graph(loop, more, max_drawn=300)
    assert call_element("cell", 2 * CALLS_SHOWN) in lay["nodes"]
    assert call_element("cell", 2 * CALLS_SHOWN + 1) not in lay["nodes"]
    last = after_tap(loop, more, more_element("cell"))
    assert last is not None
    lay = layout_graph(loop, last, max_drawn=300)
    assert call_element("cell", STEPS) in lay["nodes"] and more_element("cell") not in lay["nodes"]
    # the box folds call 17 back first (every call drawn stays drawn), then the whole module, forgetting its calls
    calls = after_tap(loop, last, "g:cell")
    assert calls == sorted(f for f in last if f != "cell#call=17")
    assert after_tap(loop, calls, "g:cell") == sorted({f for f in last if "#" not in f} | {"cell"})


def test_a_node_found_inside_the_folded_loop_opens_its_call_only(loop: dict[str, Any]) -> None:
    node = call_members(loop, "cell").calls[80][2]
    folds = reveal_node(loop, opening(loop), node)
    assert "cell#call=81" in folds and "cell" not in folds
    lay = layout_graph(loop, folds, max_drawn=300)
    assert f"n{node}" in lay["nodes"] and len(lay["nodes"]) < 300


def test_a_small_module_called_twice_opens_into_its_ops() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pool = nn.ReLU()
            self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.pool(self.a(self.pool(x * 2))))

    wire = loop_wire_of(Twice())
    assert open_module(wire, ["pool", "a", "b"], "pool") == ["a", "b"]


def loop_wire_of(model: nn.Module) -> dict[str, Any]:
    tr = gradscape.Tracer(model, tensors="summary")
    with tr.step(0) as st:
        model(torch.randn(2, 3)).sum().backward()
    return step_to_wire(st)


def test_a_loop_inside_another_module_opens_a_level_then_into_calls() -> None:
    wire = loop_wire(Wrapped(), steps=60)
    start = opening(wire)
    first = after_tap(wire, start, "m:encoder")
    assert first is not None and "encoder.cell" in first  # the encoder ran once: one level, the loop folded
    second = after_tap(wire, first, "m:encoder.cell")
    assert second is not None and f"encoder.cell#calls={CALLS_SHOWN}" in second
    lay = layout_graph(wire, second, max_drawn=300)
    assert lay["nodes"][call_element("encoder.cell", 50)]["label"].startswith("encoder.cell · call 50 of 60")


def test_a_fan_of_long_edges_shares_one_lane() -> None:
    """NOTE [Shared lanes]: a folded read-out that feeds every call drawn, one layer further down each time."""
    n = 21
    layer = [0] + list(range(2, n + 1))  # vertex 0 at the top, vertex k at layer k + 1
    groups: list[tuple[str, ...]] = [()] * n
    fan = ProperGraph(layer, groups, [(0, k) for k in range(1, n)])
    assert len(fan.layer) - n == n - 1  # one dummy a layer, shared (one a layer an edge: 190)
    for k, route in enumerate(fan.routes, 1):
        assert route[0] == 0 and route[-1] == k and len(route) == k + 2  # a dummy a layer passed
    few = ProperGraph(layer[:4], groups[:4], [(0, 1), (0, 2), (0, 3)])  # below `FAN`: a lane each
    assert len(few.layer) - 4 == 1 + 2 + 3
