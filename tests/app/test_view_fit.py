"""A module too big to draw stays folded (`app.view.collapse.fit_drawn`, `layout_graph(max_drawn=...)`):
on real traces of a module called in a loop, the way a 100,000-node recurrent step is built."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from earlier_release import step_to_wire
from torch import nn

import gradscape
from gradscape.app.view import default_collapse, expand_one_level, layout_graph
from gradscape.app.view.collapse import fit_drawn


class Loop(nn.Module):
    """An LSTMCell unrolled over `steps`, a Linear read-out at each: the cell holds most of the nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(3, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        h = c = torch.zeros(xs.shape[1], 4)
        outs = []
        for x in xs:
            h, c = self.cell(x, (h, c))
            outs.append(self.head(h))
        return torch.stack(outs)


class Wrapped(nn.Module):
    """The loop inside another module, which has ops of its own: `encoder` holds `encoder.cell`."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Loop()

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        return self.encoder(xs).tanh() * 2.0


def loop_wire(model: nn.Module, steps: int = 40) -> dict[str, Any]:
    torch.manual_seed(0)
    tr = gradscape.Tracer(model, tensors="summary")
    with tr.step(0) as st:
        model(torch.randn(steps, 2, 3)).pow(2).mean().backward()
    return step_to_wire(st)


def drawn_nodes(layout: dict[str, Any]) -> int:
    return len(layout["nodes"])


@pytest.fixture(scope="module")
def loop() -> dict[str, Any]:
    return loop_wire(Loop())


def test_a_module_too_big_to_draw_is_folded_again_and_named(loop: dict[str, Any]) -> None:
    opening = default_collapse(loop)
    assert {"cell", "head"} <= opening
    opened = expand_one_level(loop, opening, "cell")
    assert "cell" not in opened
    whole = layout_graph(loop, opened)  # without a limit, the cell is drawn node by node
    assert "m:cell" not in whole["nodes"] and drawn_nodes(whole) > 300 and whole["refolded"] == []
    fitted = layout_graph(loop, opened, max_drawn=300)
    assert fitted["refolded"] == ["cell"] and "cell" in fitted["collapsed"]
    assert "m:cell" in fitted["nodes"] and drawn_nodes(fitted) <= 300
    # the smaller module opens under the same limit: the limit is on what is drawn, not on a module
    head = layout_graph(loop, expand_one_level(loop, opening, "head"), max_drawn=300)
    assert head["refolded"] == [] and "m:head" not in head["nodes"] and "head" in head["boxes"]


def test_what_fits_is_left_as_asked(loop: dict[str, Any]) -> None:
    folded, refolded = fit_drawn(loop, set(), max_drawn=len(loop["nodes"]))
    assert (folded, refolded) == (set(), [])
    assert layout_graph(loop, set(), max_drawn=len(loop["nodes"]))["refolded"] == []


def test_the_innermost_module_that_suffices_is_folded_not_its_parent() -> None:
    wire = loop_wire(Wrapped())
    cell = sum(1 for n in wire["nodes"] if n["module"] == "encoder.cell")
    others = len(wire["nodes"]) - cell
    # open everything: folding encoder.cell alone brings it under the limit, so encoder stays open
    folded, refolded = fit_drawn(wire, set(), max_drawn=others + 1)
    assert refolded == ["encoder.cell"] and folded == {"encoder.cell"}
    # a limit no fold can meet (the model's own ops are more): the outermost module is folded, then it stops
    folded, refolded = fit_drawn(wire, set(), max_drawn=3)
    assert refolded == ["encoder"] and folded == {"encoder"}
