"""Layout and module collapsing (`app.view.layout`, `app.view.collapse`) on real traces."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
import torch
from earlier_release import step_to_wire
from zoo import ZOO, build

import gradscape
from gradscape.app.view import (
    MAX_DRAWN,
    collapse_module,
    count_crossings,
    cytoscape_elements,
    default_collapse,
    expand_module,
    expand_one_level,
    layout_graph,
    reveal,
    visible_count,
    visible_element,
)
from gradscape.app.view.layout import box_overlaps

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench/ is not a package of the distribution: import it from the checkout
    sys.path.insert(0, str(REPO))
from bench.workloads import GPT  # noqa: E402
from bench.workloads import build as build_workload  # noqa: E402


def zoo_wire(name: str, tensors: str = "summary") -> dict[str, Any]:
    case = build(name)
    tr = gradscape.Tracer(case.model, tensors=tensors)
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    return step_to_wire(st)


@pytest.fixture(scope="module")
def w4() -> dict[str, Any]:
    work = build_workload("W4")
    tr = gradscape.Tracer(work.model, tensors="summary")
    with tr.step(0) as st:
        work.loss(work.model, work.batch()).backward()
    return step_to_wire(st)


@pytest.fixture(scope="module")
def transformer() -> dict[str, Any]:
    return zoo_wire("transformer")


def node_members(layout: dict[str, Any]) -> set[int]:
    """Every node id the layout draws, directly or inside a folded module."""
    out: set[int] = set()
    for eid, info in layout["nodes"].items():
        out.update(info["members"] if eid.startswith("m:") else [int(eid[1:])])
    return out


# ---------------------------------------------------------------------------- layered, deterministic
@pytest.mark.parametrize("name", ZOO)
def test_every_edge_points_down(name: str) -> None:
    wire = zoo_wire(name)
    layout = layout_graph(wire, set())
    nodes = layout["nodes"]
    assert node_members(layout) == {n["id"] for n in wire["nodes"]}
    for src, dst, _ in wire["edges"]:
        a, b = nodes[f"n{src}"], nodes[f"n{dst}"]
        assert b["layer"] > a["layer"] and b["y"] > a["y"], (src, dst)
    assert not any(e["up"] for e in layout["edges"])
    roots = {r for p in wire["passes"] for r in p["roots"]}
    assert {nodes[f"n{r}"]["y"] for r in roots} == {0.0}  # the loss is at the top


def test_layout_is_deterministic_across_traces() -> None:
    first, second = zoo_wire("transformer"), zoo_wire("transformer")
    assert layout_graph(first, set()) == layout_graph(second, set())
    assert layout_graph(first, None) == layout_graph(first, None)


def test_positions_keep_gaps_within_a_layer(transformer: dict[str, Any]) -> None:
    layout = layout_graph(transformer, set(), dx=100.0)
    rows: dict[int, list[float]] = {}
    for info in layout["nodes"].values():
        rows.setdefault(info["layer"], []).append(info["x"])
    for xs in rows.values():
        xs.sort()
        assert all(b - a >= 100.0 - 1e-6 for a, b in zip(xs, xs[1:]))


def test_crossings_reduced_against_insertion_order(transformer: dict[str, Any]) -> None:
    ours = layout_graph(transformer, set())
    baseline = layout_graph(transformer, set(), sweeps=0)
    assert ours["crossings"] < baseline["crossings"]
    # the plain recipe: topological generations + multipartite_layout, insertion order
    g = nx.DiGraph()
    g.add_nodes_from(n["id"] for n in transformer["nodes"])
    g.add_edges_from((s, d) for s, d, _ in transformer["edges"])
    layer = {}
    for gen, ids in enumerate(nx.topological_generations(g)):
        for v in ids:
            g.nodes[v]["layer"] = layer[v] = gen
    pos = nx.multipartite_layout(g, subset_key="layer", align="horizontal")
    n = len(transformer["nodes"])
    multipartite = count_crossings([layer[i] for i in range(n)], [pos[i][0] for i in range(n)], list(g.edges()))
    nodes = ours["nodes"]
    drawn = count_crossings([nodes[f"n{i}"]["layer"] for i in range(n)], [nodes[f"n{i}"]["x"] for i in range(n)],
                            list(g.edges()))  # straight edges, ignoring the bends
    assert ours["crossings"] < multipartite and drawn < multipartite


def test_count_crossings_matches_geometry() -> None:
    # layers 0-1: 0→3 and 1→2 cross, 0→2 and 1→3 do not; the long edge 4→5 (layers 0→2) passes
    # x=1.0 at layer 1, so it crosses 1→3 (x 1.0 → 1.5) but not the far-right 6→7
    layer = [0, 0, 1, 1, 0, 2, 1, 2]
    x = [0.0, 1.0, 0.0, 1.5, 2.0, 0.0, 3.0, 3.0]
    assert count_crossings(layer, x, [(0, 3), (1, 2)]) == 1
    assert count_crossings(layer, x, [(0, 2), (1, 3)]) == 0
    assert count_crossings(layer, x, [(0, 3), (0, 2)]) == 0  # a shared end is not a crossing
    assert count_crossings(layer, x, [(4, 5), (1, 3)]) == 1
    assert count_crossings(layer, x, [(4, 5), (6, 7)]) == 0


def test_module_stays_contiguous_in_every_layer(w4: dict[str, Any]) -> None:
    layout = layout_graph(w4, set())
    rows: dict[int, list[tuple[float, str | None]]] = {}
    for info in layout["nodes"].values():
        rows.setdefault(info["layer"], []).append((info["x"], info["parent"]))
    for row in rows.values():
        row.sort()
        for depth in range(1, 5):
            keys = [".".join(p.split(".")[:depth]) if p else None for _, p in row]
            runs = [k for i, k in enumerate(keys) if k is not None and (i == 0 or keys[i - 1] != k)]
            assert len(runs) == len(set(runs)), (depth, row)  # each module one run per layer


def test_expanded_w4_stays_upright(w4: dict[str, Any]) -> None:
    """A 12-block GPT is a column of blocks, not a staircase: the drawing is at most a few block
    widths wide although it is 280 layers deep."""
    layout = layout_graph(w4, set())
    assert layout["layers"] > 250
    assert layout["crossings"] == 0
    assert layout["width"] < 15 * 110.0


# ---------------------------------------------------------------------------- collapsing
def test_small_graphs_collapse_nothing(transformer: dict[str, Any]) -> None:
    assert default_collapse(transformer) == set()
    assert layout_graph(transformer)["collapsed"] == []


def test_w4_opens_collapsed_and_expanding_adds_exactly_its_nodes(w4: dict[str, Any]) -> None:
    folded = default_collapse(w4, max_visible=300)
    assert visible_count(w4, ()) > 300
    assert {f"blocks.{i}" for i in range(12)} <= folded and "blocks" not in folded
    layout = layout_graph(w4, None)
    assert layout["collapsed"] == sorted(folded)
    elements = cytoscape_elements(w4, layout)
    assert len(elements) == visible_count(w4, folded) < 300
    assert node_members(layout) == {n["id"] for n in w4["nodes"]}

    block = layout["nodes"]["m:blocks.3"]["members"]
    inside = {n["id"] for n in w4["nodes"]
              if (n["module"] or "").startswith("blocks.3.") or n["module"] == "blocks.3"
              or (n["param"] or "").startswith("blocks.3.")}
    assert set(block) == inside
    opened = layout_graph(w4, expand_module(folded, "blocks.3"))
    before, after = set(layout["nodes"]), set(opened["nodes"])
    assert before - after == {"m:blocks.3"}
    assert after - before == {f"n{i}" for i in inside}
    assert collapse_module(expand_module(folded, "blocks.3"), "blocks.3") == folded


def test_the_default_folds_lay_out_as_the_same_folds_given(w4: dict[str, Any]) -> None:
    """`layout_graph(wire, None)` reuses the folded graph `default_folds` built on the way; it must lay out
    exactly as the same folds passed in, which builds it anew, also when `max_drawn` folds more."""
    folded = default_collapse(w4)
    assert folded and layout_graph(w4, None) == layout_graph(w4, folded)
    assert layout_graph(w4, None, max_drawn=MAX_DRAWN) == layout_graph(w4, folded, max_drawn=MAX_DRAWN)
    assert layout_graph(w4, None, max_drawn=8) == layout_graph(w4, folded, max_drawn=8)
    assert layout_graph(w4, None, max_drawn=8)["refolded"]


def test_expand_one_level_keeps_submodules_folded(w4: dict[str, Any]) -> None:
    folded = default_collapse(w4)
    opened = expand_one_level(w4, folded, "blocks.3")
    assert opened - folded == {"blocks.3.ln1", "blocks.3.attn", "blocks.3.ln2", "blocks.3.mlp"}
    assert folded - opened == {"blocks.3"}
    layout = layout_graph(w4, opened)
    own = {f"n{n['id']}" for n in w4["nodes"] if n["module"] == "blocks.3"}  # the two residual adds
    assert own and own <= set(layout["nodes"])
    assert layout["nodes"]["m:blocks.3.attn"]["parent"] == "blocks.3"


def test_folded_edges_account_for_every_wire_edge(w4: dict[str, Any]) -> None:
    layout = layout_graph(w4, None)
    drawn = sum(len(e["slots"]) for e in layout["edges"])
    hidden = {str(i): e for e, info in layout["nodes"].items() for i in info.get("members", ())}
    internal = sum(1 for s, d, _ in w4["edges"] if str(s) in hidden and hidden.get(str(s)) == hidden.get(str(d)))
    assert drawn + internal == len(w4["edges"])
    for e in layout["edges"]:
        for src, dst, _ in e["slots"]:
            assert hidden.get(str(src), f"n{src}") == e["source"]
            assert hidden.get(str(dst), f"n{dst}") == e["target"]


def test_reveal_and_visible_element(w4: dict[str, Any]) -> None:
    folded = default_collapse(w4)
    node = next(n["id"] for n in w4["nodes"] if n["module"] == "blocks.5.attn.qkv")
    layout = layout_graph(w4, folded)
    assert visible_element(layout, f"n{node}") == "m:blocks.5"
    assert visible_element(layout, "m:blocks.5.attn") == "m:blocks.5"
    shown = layout_graph(w4, reveal(w4, folded, node))
    assert visible_element(shown, f"n{node}") == f"n{node}"
    assert visible_element(shown, "m:blocks.5.attn") == "g:blocks.5.attn"


def test_folding_a_module_called_twice_keeps_every_node() -> None:
    """`Tied` runs `mix` twice with ops in between: folding it closes a cycle. The layout still
    places everything and marks the edge that closes the cycle as pointing up."""
    wire = zoo_wire("tied")
    layout = layout_graph(wire, {"mix"})
    assert node_members(layout) == {n["id"] for n in wire["nodes"]}
    for e in layout["edges"]:
        a, b = layout["nodes"][e["source"]], layout["nodes"][e["target"]]
        assert (b["layer"] <= a["layer"]) == e["up"]


# ---------------------------------------------------------------------------- size and speed
def chain_wire(length: int) -> dict[str, Any]:
    x = torch.randn(4, requires_grad=True)
    y = x
    tr = gradscape.Tracer(None, tensors="summary", thumb=4)
    with tr.step(0) as st:
        for i in range(length):
            y = y * 1.0001 if i % 2 else y + 0.5
        y.sum().backward()
    return step_to_wire(st)


def test_ten_thousand_node_chain_lays_out_fast() -> None:
    wire = chain_wire(10_000)
    assert len(wire["nodes"]) > 10_000
    start = time.process_time()
    layout = layout_graph(wire, set())
    elapsed = time.process_time() - start
    assert layout["layers"] == len(wire["nodes"])  # a chain: one node per layer
    assert layout["crossings"] == 0
    assert elapsed < 3.0, f"10k-node layout took {elapsed:.2f} s of CPU"  # ~0.2 s measured; slack for a busy box


def test_many_layer_gpt_lays_out_fast() -> None:
    torch.manual_seed(0)
    model = GPT(50, 8, 90, 16, 2)
    tok = torch.randint(0, 50, (2, 9))
    tr = gradscape.Tracer(model, tensors="summary", thumb=4)
    with tr.step(0) as st:
        logits = model(tok[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, 50), tok[:, 1:].reshape(-1)).backward()
    wire = step_to_wire(st)
    assert len(wire["nodes"]) > 3500
    start = time.process_time()
    full = layout_graph(wire, set())
    elapsed = time.process_time() - start
    assert full["crossings"] == 0
    assert elapsed < 3.0, f"{len(wire['nodes'])}-node layout took {elapsed:.2f} s of CPU"  # ~0.15 s measured
    folded = layout_graph(wire, None)
    assert len(cytoscape_elements(wire, folded)) <= 300


# ---------------------------------------------------------------------------- module boxes
def demo_wire(name: str) -> dict[str, Any]:
    from gradscape.app import demo

    model, batch = demo.make(name)
    x, y = batch()
    tr = gradscape.Tracer(model, tensors="summary")
    with tr.step(0) as st:
        out = model(x)
        torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
    return step_to_wire(st)


def workload_wire(key: str) -> dict[str, Any]:
    work = build_workload(key)
    tr = gradscape.Tracer(work.model, tensors="summary")
    with tr.step(0) as st:
        work.loss(work.model, work.batch()).backward()
    return step_to_wire(st)


def intersecting_siblings(layout: dict[str, Any]) -> list[tuple[str, str]]:
    """Sibling boxes whose drawn rectangles intersect, computed here from node positions and sizes."""
    rect: dict[str, list[float]] = {}
    for info in layout["nodes"].values():
        box, grow = info["parent"], 0.0
        while box is not None:
            grow += 10.0  # the stylesheet's box padding, per level
            r = rect.setdefault(box, [1e18, 1e18, -1e18, -1e18])
            r[0] = min(r[0], info["x"] - info["w"] / 2 - grow)
            r[1] = min(r[1], info["y"] - info["h"] / 2 - grow)
            r[2] = max(r[2], info["x"] + info["w"] / 2 + grow)
            r[3] = max(r[3], info["y"] + info["h"] / 2 + grow)
            box = layout["boxes"][box]
    names = sorted(rect)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if layout["boxes"][a] == layout["boxes"][b]
            and rect[a][0] < rect[b][2] and rect[b][0] < rect[a][2]
            and rect[a][1] < rect[b][3] and rect[b][1] < rect[a][3]]


@pytest.mark.parametrize("source", ["demo:mlp", "demo:cnn", "demo:transformer", *[f"zoo:{z}" for z in ZOO],
                                    "bench:W1", "bench:W2", "bench:W3", "bench:W4"])
def test_sibling_module_boxes_never_intersect(source: str) -> None:
    kind, name = source.split(":")
    wire = demo_wire(name) if kind == "demo" else zoo_wire(name) if kind == "zoo" else workload_wire(name)
    top = {p.split(".")[0] for n in wire["nodes"] for p in [n.get("module") or ""] if p and p != "<root>"}
    for folded in (set(), None, {t + ".0" for t in top}):
        layout = layout_graph(wire, folded)
        assert intersecting_siblings(layout) == [], (source, folded)
        assert box_overlaps(layout) == []


def test_mlp_layers_are_stacked_bands() -> None:
    layout = layout_graph(demo_wire("mlp"), set())
    span = {}
    for info in layout["nodes"].values():
        if info["parent"]:
            lo, hi = span.get(info["parent"], (10**9, -1))
            span[info["parent"]] = (min(lo, info["layer"]), max(hi, info["layer"]))
    assert span["fc3"][1] < span["fc2"][0] and span["fc2"][1] < span["fc1"][0]


def test_first_expand_keeps_what_was_above_in_place_and_boxes_apart(w4: dict[str, Any]) -> None:
    """Opening any folded module of the opening view (as a click does) draws it, moves every element
    above it together (the page's pan then keeps them where they were on screen), keeps the top-to-bottom
    order of what was drawn, and leaves no sibling boxes overlapping."""
    opening = sorted(default_collapse(w4))
    before = layout_graph(w4, opening)
    assert len(opening) >= 12
    for module in opening:
        after = layout_graph(w4, expand_one_level(w4, opening, module))
        assert module in after["boxes"] and f"m:{module}" not in after["nodes"]
        assert any(info["parent"] == module for info in after["nodes"].values())
        assert box_overlaps(after) == []
        anchor = before["nodes"][f"m:{module}"]["y"]
        kept = [e for e in before["nodes"] if e in after["nodes"]]
        above = [e for e in kept if before["nodes"][e]["y"] < anchor]
        moves = {(round(after["nodes"][e]["x"] - before["nodes"][e]["x"]),
                  round(after["nodes"][e]["y"] - before["nodes"][e]["y"])) for e in above}
        assert len(moves) <= 1, (module, moves)  # one rigid shift, or none
        order = sorted(kept, key=lambda e: (before["nodes"][e]["y"], e))
        ys = [after["nodes"][e]["y"] for e in order]
        assert ys == sorted(ys), module
