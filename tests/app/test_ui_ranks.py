"""The page's reads by rank (app/ui): the address a selection writes, the rank and steps a deep link or
another run picks, and every read of `PageData` (graph, layout, search, flow over steps, inspector,
problems) keyed by rank, on a real trace file where two ranks traced their own batches and stored
different steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pytest
import torch
import torch.nn as nn
from earlier_release import step_to_wire, write_maps

import gradscape
from gradscape.app import view
from gradscape.app.data import PageData
from gradscape.app.ui import compare, graph, ids, inspector, page, problems, runs
from gradscape.app.ui.address import address, link_rank
from gradscape.app.view.problems import problem_lines
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire import STAT_NAMES

RANK_STEPS = {0: [0, 1, 2], 1: [0, 1]}  # rank 1 is a step behind


def _wire(step: int, rank: int | None, world: int | None) -> dict[str, Any]:
    torch.manual_seed(0)  # the same model on every rank...
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    gen = torch.Generator().manual_seed(100 * (rank or 0) + step)  # ...and each rank its own batch
    x = torch.randn(5, 3, generator=gen)
    tr = gradscape.Tracer(model, run="ddp" if world else "single", tensors="full")
    with tr.step(step) as st:
        model(x).pow(2).sum().backward()
    tr.close()
    assert st is not None
    wire = step_to_wire(st)
    wire["rank"], wire["world_size"] = rank, world
    return wire


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("ranks") / "t.sqlite"
    with TraceStore(path) as st:
        for rank, steps in RANK_STEPS.items():
            for step in steps:
                write_maps(st, _wire(step, rank, 2))
        write_maps(st, _wire(0, None, None))  # outside torch.distributed: rank 0 only
        yield st


def _arrived(wire: dict[str, Any], node: int) -> dict[str, Any]:
    """The summary of what arrived at `node` (∂L/∂ its output)."""
    return dict(wire["tensors"][wire["nodes"][node]["go"][0]])


def _norm(t: dict[str, Any]) -> float:
    return float(t["stats"][STAT_NAMES.index("norm")])


def _differing_node(a: dict[str, Any], b: dict[str, Any]) -> int:
    """The first node to run whose arriving gradient differs between two ranks' traces of a step (the
    loss's own node gets 1 on every rank)."""
    return next(n for n, _ in a["execution"] if _norm(_arrived(a, n)) != _norm(_arrived(b, n)))


def _texts(component: Any) -> str:
    """Every string inside a Dash component tree, joined."""
    if isinstance(component, str):
        return component
    if isinstance(component, (list, tuple)):
        return " ".join(_texts(c) for c in component)
    children = getattr(component, "children", None)
    return _texts(children) if children is not None else ""


def test_the_address_names_the_rank_only_when_it_is_not_0() -> None:
    sel = {"run": "my run/1", "step": 3, "node": 12}
    assert address(sel) == "?" + urlencode(sel)  # as the page always wrote it
    assert address({**sel, "rank": 0}) == "?run=my+run%2F1&step=3&node=12"
    assert address({**sel, "rank": 1}) == "?run=my+run%2F1&rank=1&step=3&node=12"
    assert dict(parse_qsl(address({**sel, "rank": 7})[1:])) == {"run": "my run/1", "rank": "7", "step": "3",
                                                                "node": "12"}


def test_a_link_without_a_rank_names_rank_0() -> None:
    assert link_rank(None) == 0 and link_rank({}) == 0 and link_rank({"run": "r", "step": 1}) == 0
    assert link_rank({"run": "r", "rank": 3}) == 3


def test_the_rank_shown_follows_a_link_then_the_current_rank_then_the_first() -> None:
    ranks = [0, 1, 2]
    assert compare.rank_choice(ranks, "r", {"run": "r", "rank": 2}, 1) == 2
    assert compare.rank_choice(ranks, "r", {"run": "r"}, 1) == 0  # a link without rank= opens rank 0
    assert compare.rank_choice(ranks, "r", {"run": "other", "rank": 2}, 1) == 1  # a link to another run
    assert compare.rank_choice(ranks, "r", {"run": "r", "rank": 5}, 1) == 1  # a rank the run lacks
    assert compare.rank_choice(ranks, "r", None, 1) == 1
    assert compare.rank_choice([1, 2], "r", None, 0) == 1  # rank 0 stored nothing yet: the first
    assert compare.rank_choice([], None, None, 3) == 0
    assert compare.rank_field([0]) == ([{"label": "rank 0", "value": 0}], 0, True, compare.HIDDEN)
    assert compare.rank_field([0, 1])[2:] == (False, {})


def test_the_step_list_holds_the_steps_of_the_rank_shown(store: TraceStore) -> None:
    options, value = runs.step_choices(PageData(store), "ddp", None, 2, rank=0)
    assert [o["value"] for o in options] == [0, 1, 2] and value == 2
    options, value = runs.step_choices(PageData(store), "ddp", None, 2, rank=1)
    assert [o["value"] for o in options] == [0, 1] and value == 1  # step 2 is not on rank 1: its newest
    assert runs.step_choices(PageData(store), "ddp", None, 0, rank=1)[1] == 0  # the step shown stays
    link = {"run": "ddp", "rank": 1, "step": 0, "node": 1}
    assert runs.step_choices(PageData(store), "ddp", link, 1, ids.DEEP_LINK, rank=1)[1] == 0
    # a link to rank 0's step does not move rank 1's
    assert runs.step_choices(PageData(store), "ddp", {**link, "rank": 0}, 1, ids.DEEP_LINK, rank=1)[1] == 1
    assert [o["value"] for o in runs.step_choices(PageData(store), "single", None, None)[0]] == [0]


def test_every_read_of_the_page_is_keyed_by_rank(store: TraceStore) -> None:
    data = PageData(store)
    g0, g1 = data.graph("ddp", 1, 0), data.graph("ddp", 1, 1)
    assert (g0["rank"], g1["rank"]) == (0, 1)
    assert g1 == store.read_graph("ddp", 1, 1)
    assert data.graph("ddp", 1) is g0  # rank 0 unless named, as before ranks
    _differing_node(g0, g1)  # the ranks' own batches: what arrived at a node (∂L/∂output) differs
    assert data.layout("ddp", 1, None, 1) is not data.layout("ddp", 1, None, 0)
    assert data.search_index("ddp", 1, 1) == view.search_index(g1)
    # flow over steps: the rank's own steps up to the one shown
    flow0, flow1 = data.flow_over_steps("ddp", 2, 0), data.flow_over_steps("ddp", 2, 1)
    assert flow0["data"][0]["x"] == [0, 1, 2] and flow1["data"][0]["x"] == [0, 1]
    assert flow1 == view.norm_over_steps([store.read_graph("ddp", s, 1) for s in (0, 1)])


def test_the_graph_inspector_and_problems_of_a_rank(store: TraceStore) -> None:
    data = PageData(store)
    elements, order, *_ = graph.graph_payload(data, "ddp", 1, "norm", None, rank=1)
    wire1 = store.read_graph("ddp", 1, 1)
    assert elements == view.cytoscape_elements(wire1, view.layout_graph(wire1), "norm")
    assert order is not None and (order["run"], order["rank"], order["step"]) == ("ddp", 1, 1)
    node = _differing_node(store.read_graph("ddp", 1, 0), wire1)
    panels = {rank: inspector.inspector_payload(data, {"run": "ddp", "rank": rank, "step": 1, "node": node}).node
              for rank in (0, 1)}
    text1 = _texts(panels[1])
    assert "rank 1 of 2" in text1 and "rank 1 of 2" not in _texts(panels[0])
    norm = next(r["text"] for r in view.stats_rows(_arrived(wire1, node)) if r["stat"] == "norm")
    assert norm in text1 and norm not in _texts(panels[0])  # the rank's own statistics
    assert problems.lines_of(data, "ddp", 1, 1) == problem_lines(wire1)
    single = inspector.inspector_payload(data, {"run": "single", "step": 0, "node": node}).node
    assert " · rank " not in _texts(single)  # outside torch.distributed: no rank shown


def test_the_first_page_of_a_run_shows_its_first_rank(tmp_path: Path) -> None:
    with TraceStore(tmp_path / "t.sqlite") as st:
        write_maps(st, _wire(0, 1, 2))  # rank 0 has stored nothing yet
        state = page.initial_state(PageData(st))
    assert state["ranks"] == [1] and state["step"] == 0 and state["order"]["rank"] == 1
    assert state["selected"]["rank"] == 1
