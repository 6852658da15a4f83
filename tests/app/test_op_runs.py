"""A box of over a thousand ops draws them in runs (`app.view.op_runs`): on real traces of a recurrence written
by hand in one module's forward (a scan called once: no submodule, no second call to open into), the runs'
members in the order backward ran them (read from the step's execution order), what a click on a run and on
the box draws, a node found inside a run, the fit to what the page draws, and a call of such a module."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from earlier_release import step_to_wire
from torch import nn

import gradscape
from gradscape.app.view import after_tap, cytoscape_elements, layout_graph, reveal_node
from gradscape.app.view.call_folds import split_folds
from gradscape.app.view.ids import call_element, node_of, run_element, run_of
from gradscape.app.view.op_runs import RUN_OPS, RUNS_FROM, RUNS_SHOWN, Runs, run_tokens, split_runs

STEPS = 320  # four ops a time step: about 1,280 ops in the scan's box, 13 runs


class Scan(nn.Module):
    """h ← tanh(h·w + x_t·u) over the sequence, written out in the forward: every op is the scan's own."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.u = nn.Parameter(torch.randn(4))

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        h = xs.new_zeros(xs.shape[1:])
        for x in xs:
            h = torch.tanh(h * self.w + x * self.u)
        return h


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scan = Scan()
        self.head = nn.Linear(4, 1)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        return self.head(self.scan(xs))


class Twice(Model):
    """The scan called on two sequences: it opens into its calls, each of over `RUNS_FROM` ops."""

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        return self.head(self.scan(xs) + self.scan(xs.flip(0)))


def traced(model: nn.Module, steps: int = STEPS) -> dict[str, Any]:
    torch.manual_seed(0)
    tr = gradscape.Tracer(model, tensors="summary")
    with tr.step(0) as st:
        model(torch.randn(steps, 2, 4)).pow(2).mean().backward()
    return step_to_wire(st)


@pytest.fixture(scope="module")
def scan() -> dict[str, Any]:
    return traced(Model())


def scan_ops(wire: dict[str, Any], module: str = "scan") -> list[int]:
    """The ops drawn in the scan's box, in the order backward first ran them (from the step's execution
    order; those that did not run after, by id)."""
    ids = [n["id"] for n in wire["nodes"] if n["module"] == module or (n["param"] or "").startswith(module + ".")]
    first: dict[int, int] = {}
    for k, (nid, _run) in enumerate(wire["execution"]):
        first.setdefault(nid, k)
    return sorted(ids, key=lambda n: first.get(n, len(wire["nodes"]) + n))


def opened_scan(wire: dict[str, Any]) -> list[str]:
    start = layout_graph(wire, None)["collapsed"]
    assert "scan" in start
    folds = after_tap(wire, start, "m:scan")
    assert folds is not None and "scan" not in folds
    return folds


def test_the_run_tokens_read_back_and_are_no_call_folds() -> None:
    items = ["head", "scan#run=0.3", "enc.scan#run=17.2", "cell#calls=50", "scan#runs=0.100"]
    assert split_runs(items) == Runs({("scan", 0, 3), ("enc.scan", 17, 2)}, {("scan", 0): 100})
    assert run_tokens(split_runs(items)) == ["enc.scan#run=17.2", "scan#run=0.3", "scan#runs=0.100"]
    assert split_folds(items) == ({"head"}, split_folds(["cell#calls=50"])[1])
    assert run_of(run_element("enc.scan", 17, 2)) == ("enc.scan", 17, 2) and run_of("c:cell#17") is None
    assert run_element("scan", 0, 0) == "o:scan#0.more" and run_of("o:scan#0.more") == ("scan", 0, 0)


def test_an_opened_scan_draws_its_ops_in_runs_in_backward_order(scan: dict[str, Any]) -> None:
    ops = scan_ops(scan)
    assert len(ops) > RUNS_FROM
    lay = layout_graph(scan, opened_scan(scan), max_drawn=300)
    runs = [e for e in lay["nodes"] if run_of(e) is not None]
    assert len(runs) == -(-len(ops) // RUN_OPS) and lay["refolded"] == []
    assert not any(node_of(e) in ops for e in lay["nodes"])  # no op of the scan drawn one by one
    for k, eid in enumerate(runs):
        assert eid == run_element("scan", 0, k + 1) and lay["nodes"][eid]["parent"] == "scan"
        assert sorted(lay["nodes"][eid]["members"]) == sorted(ops[k * RUN_OPS:(k + 1) * RUN_OPS])
    last = min(2 * RUN_OPS, len(ops))
    assert lay["nodes"][runs[1]]["label"] == f"scan\nops {RUN_OPS + 1:,}–{last:,} of {len(ops):,}"
    # the page's elements: each run folded, labelled, holding its node ids for the player
    els = {e["data"]["id"]: e for e in cytoscape_elements(scan, lay)}
    first = els[runs[0]]
    assert {"collapsed", "run"} <= set(first["classes"].split()) and first["data"]["kind"] == "run"
    assert [n for a, b in first["data"]["ranges"] for n in range(a, b + 1)] == sorted(ops[:RUN_OPS])
    assert first["data"]["count"] == RUN_OPS


def test_a_click_on_a_run_draws_its_ops_and_the_box_folds_it_back_then_the_module(scan: dict[str, Any]) -> None:
    folds = opened_scan(scan)
    ops = scan_ops(scan)
    second = after_tap(scan, folds, run_element("scan", 0, 2))
    assert second is not None and "scan#run=0.2" in second
    lay = layout_graph(scan, second, max_drawn=600)
    assert run_element("scan", 0, 2) not in lay["nodes"] and run_element("scan", 0, 1) in lay["nodes"]
    assert all(f"n{n}" in lay["nodes"] for n in ops[RUN_OPS:2 * RUN_OPS])
    assert lay["collapsed"] == second and lay["refolded"] == []
    # other folds keep the run opened; the box folds the run back first, then the scan
    head = after_tap(scan, lay["collapsed"], "m:head")
    assert head is not None and "scan#run=0.2" in head and "head" not in head
    back = after_tap(scan, second, "g:scan")
    assert back == folds
    assert back is not None and "scan" in (after_tap(scan, back, "g:scan") or [])


def test_a_node_found_inside_a_run_opens_the_scan_and_that_run_only(scan: dict[str, Any]) -> None:
    ops = scan_ops(scan)
    node = ops[2 * RUN_OPS + 7]  # in run 3
    start = layout_graph(scan, None)["collapsed"]
    folds = reveal_node(scan, start, node)
    assert "scan" not in folds and "scan#run=0.3" in folds
    lay = layout_graph(scan, folds, max_drawn=600)
    assert f"n{node}" in lay["nodes"] and run_element("scan", 0, 3) not in lay["nodes"]


def test_a_scan_past_the_page_limit_is_drawn_in_runs_not_folded_again(scan: dict[str, Any]) -> None:
    # before runs, a box of more ops than the page draws stayed folded, with nothing to click into
    lay = layout_graph(scan, opened_scan(scan), max_drawn=100)
    assert lay["refolded"] == [] and "g:scan" not in lay["nodes"] and "scan" in lay["boxes"]
    assert len(lay["nodes"]) < 100


def test_a_call_of_over_a_thousand_ops_opens_into_runs_of_that_call() -> None:
    wire = traced(Twice())
    folds = opened_scan(wire)  # called twice: into its calls
    assert any(f.startswith("scan#calls=") for f in folds)
    opened = after_tap(wire, folds, call_element("scan", 1))
    assert opened is not None
    lay = layout_graph(wire, opened, max_drawn=300)
    runs = [e for e in lay["nodes"] if run_of(e) is not None]
    # the call's ops are drawn in the call's own box, inside the scan's
    assert runs and all(run_of(e)[:2] == ("scan#1", 1) for e in runs)  # type: ignore[index]
    assert all(lay["nodes"][e]["parent"] == "scan#1" for e in runs) and lay["boxes"]["scan#1"] == "scan"
    assert lay["box_labels"]["scan#1"] == "scan · call 1 of 2"
    assert call_element("scan", 2) in lay["nodes"]  # the other call stays folded
    inner = after_tap(wire, lay["collapsed"], runs[0])
    assert inner is not None and "scan#1#run=1.1" in inner and "scan#call=1" in inner
    drawn = layout_graph(wire, inner, max_drawn=1000)
    assert sum(1 for e in drawn["nodes"] if node_of(e) is not None) >= RUN_OPS
    # the call's box folds its run back, then the call alone
    assert after_tap(wire, drawn["collapsed"], "g:scan#1") == opened
    assert after_tap(wire, opened, "g:scan#1") == folds


def test_a_scan_of_over_fifty_runs_draws_fifty_and_a_node_for_the_rest() -> None:
    wire = traced(Model(), steps=1_500)  # 6,002 ops: 61 runs
    ops = scan_ops(wire)
    runs = -(-len(ops) // RUN_OPS)
    assert runs > RUNS_SHOWN
    folds = opened_scan(wire)
    lay = layout_graph(wire, folds, max_drawn=10_000)
    drawn = [e for e in lay["nodes"] if run_of(e) is not None]
    assert drawn == [run_element("scan", 0, k) for k in range(1, RUNS_SHOWN + 1)] + ["o:scan#0.more"]
    rest = lay["nodes"]["o:scan#0.more"]
    assert sorted(rest["members"]) == sorted(ops[RUNS_SHOWN * RUN_OPS:])
    assert rest["label"] == f"scan\nops {RUNS_SHOWN * RUN_OPS + 1:,}–{len(ops):,} of {len(ops):,}"
    els = {e["data"]["id"]: e for e in cytoscape_elements(wire, lay)}
    assert "more" in els["o:scan#0.more"]["classes"].split() and "more" not in els[drawn[0]]["classes"].split()
    # a click on it draws the rest; a node found in the last run opens that run
    more = after_tap(wire, lay["collapsed"], "o:scan#0.more")
    assert more is not None and f"scan#runs=0.{2 * RUNS_SHOWN}" in more
    lay = layout_graph(wire, more, max_drawn=10_000)
    assert run_element("scan", 0, runs) in lay["nodes"] and "o:scan#0.more" not in lay["nodes"]
    fewer = after_tap(wire, [f for f in more if "#runs=" not in f] + ["scan#runs=0.55"], "m:head")
    rest = layout_graph(wire, fewer, max_drawn=10_000)["nodes"]["o:scan#0.more"]  # past the 55 drawn
    assert rest["label"] == f"scan\nops {55 * RUN_OPS + 1:,}–{len(ops):,} of {len(ops):,}"
    found = reveal_node(wire, folds, ops[-1])
    assert f"scan#run=0.{runs}" in found
    lay = layout_graph(wire, found, max_drawn=10_000)
    assert f"n{ops[-1]}" in lay["nodes"] and "o:scan#0.more" in lay["nodes"]
