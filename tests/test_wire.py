"""The wire schema (`gradscape.tracer.wire`): real steps round-trip, and random mutations of real steps raise nothing
but `TraceFormatError` (naming a field); what decodes is storable and answered by the JSON API's readers."""

from __future__ import annotations

import contextlib
import copy
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from earlier_release import step_to_wire, write_maps
from zoo import build

import gradscape
from gradscape.app.api import graph_json
from gradscape.tracer._model import Problem
from gradscape.tracer.store import TraceStore
from gradscape.tracer.wire import (
    TraceFormatError,
    WireCall,
    WireModule,
    WireNode,
    WirePass,
    WireProblem,
    WireRun,
    WireStep,
    WireTensor,
    node_runs,
    pack,
    step_from_wire,
    tensor_from_wire,
    unpack,
)

ROOT = Path(__file__).resolve().parent.parent


def _step(name: str, tensors: str = "summary") -> gradscape.StepTrace:
    case = build(name)
    tr = gradscape.Tracer(case.model, run=f"fuzz-{name}", tensors=tensors)
    with tr.step(2) as st:
        case.loss(case.model, case.batch).backward()
    assert st is not None
    return st


@pytest.fixture(scope="module")
def wires() -> list[dict[str, Any]]:
    return [unpack(pack(step_to_wire(_step("mlp", "full")))), unpack(pack(step_to_wire(_step("cnn"))))]


def _thin(wire: dict[str, Any]) -> dict[str, Any]:
    """The step with its arrays cut to a few bytes (same fields), so each mutation copies little."""
    w = copy.deepcopy(wire)
    for t in w["tensors"]:
        for key in ("thumb", "values"):
            if t[key] is not None:
                t[key] = {"dtype": "<f4", "shape": [1, 1], "data": b"\0\0\0\0"}
    return w


HOSTILE: list[Any] = [None, -1, 0, 1, 2 ** 63, 2 ** 64 - 1, -(2 ** 63) - 1, True, 1.5, float("nan"), "", "x",
                      "\x00", b"\xff", [], [None], [1, 2, 3], [[1, -1]], {}, {"k": 1}, {1: 2}, {"dtype": "<f4"}]


def _paths(v: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(v, dict):
        for k, x in v.items():
            out += _paths(x, (*path, k))
    elif isinstance(v, list):
        for k, x in enumerate(v):
            out += _paths(x, (*path, k))
    return out


def _mutate(wire: dict[str, Any], paths: list[tuple[Any, ...]], rng: random.Random) -> dict[str, Any]:
    w = copy.deepcopy(wire)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        path = rng.choice(paths)
        parent = w
        try:
            for k in path[:-1]:
                parent = parent[k]
        except (TypeError, IndexError, KeyError):  # an earlier mutation changed the way there
            continue
        key = path[-1]
        if not isinstance(parent, (dict, list)):
            continue
        op = rng.random()
        try:
            if op < 0.15 and isinstance(parent, dict):
                del parent[key]
            elif op < 0.25 and isinstance(parent, list):
                del parent[key:]
            elif op < 0.3 and isinstance(parent, dict):
                parent[rng.choice(HOSTILE) if rng.random() < 0.3 else "extra"] = rng.choice(HOSTILE)
            else:
                parent[key] = copy.deepcopy(rng.choice(HOSTILE))
        except (TypeError, IndexError, KeyError):  # an unhashable key, a list already cut
            continue
    return w


def test_real_steps_round_trip(wires: list[dict[str, Any]]) -> None:
    for w in wires:
        st = step_from_wire(w)
        assert unpack(pack(step_to_wire(st))) == w


def test_typed_structures_are_the_wire_form() -> None:
    # The types the view and API are checked against (gradscape.tracer.wire) name exactly the keys a real step has.
    st = _step("cnn")
    st.problems.append(Problem(kind="no_grad", message="m", node=0, param="p", source="x.py:1"))
    w: Any = unpack(pack(step_to_wire(st)))
    assert set(w) == WireStep.__required_keys__
    assert w["nodes"] and all(set(n) == WireNode.__required_keys__ for n in w["nodes"])
    for t in w["tensors"]:
        assert WireTensor.__required_keys__ <= set(t) <= WireTensor.__required_keys__ | WireTensor.__optional_keys__
    assert w["modules"] and all(set(m) == WireModule.__required_keys__ for m in w["modules"].values())
    calls = [c for m in w["modules"].values() for c in m["calls"]]
    assert calls and all(set(c) == WireCall.__required_keys__ for c in calls)
    assert w["passes"] and all(set(p) == WirePass.__required_keys__ for p in w["passes"])
    assert all(set(p) == WireProblem.__required_keys__ for p in w["problems"])
    ran = [n for n in st.nodes if n.runs]
    assert ran
    for n in ran:
        runs = node_runs(w["nodes"][n.id])
        assert all(len(r) == len(WireRun._fields) for r in w["nodes"][n.id]["runs"])
        named = [(r.pass_index, r.order, r.time_us) for r in runs]
        assert named == [(r.pass_index, r.order, r.time_us) for r in n.runs]
        assert [len(r.go) for r in runs] == [len(r.grad_outputs) for r in n.runs]


def test_files_from_an_earlier_release_read_with_every_field(tmp_path: Path) -> None:
    # A step written before `problems`, `rank`, `world_size` (and a node's `runs` and `t`) existed: the
    # store fills what step_from_wire would take them to mean, so the view and API can index every key.
    from gradscape.app import view
    from gradscape.app.view.problems import problem_lines

    w: Any = step_to_wire(_step("mlp"))
    for key in ("problems", "not_in_step", "rank", "world_size"):
        del w[key]
    for n in w["nodes"]:
        del n["runs"], n["t"]
    with TraceStore(tmp_path / "old.sqlite") as store:
        write_maps(store, w)
        graph = store.read_graph("fuzz-mlp", 2)
    assert set(graph) == WireStep.__required_keys__
    assert graph["problems"] == [] and graph["not_in_step"] == [] and graph["rank"] is None
    assert graph["world_size"] is None
    assert all(n["runs"] == [] and n["t"] is None for n in graph["nodes"])
    assert problem_lines(graph)["count"] == 0
    assert graph_json(graph)["rank"] is None
    elements = view.cytoscape_elements(graph, view.layout_graph(graph))
    assert len([e for e in elements if e["group"] == "nodes" and "node" in e["data"]]) == len(graph["nodes"])


def test_version_one_trace_files_still_read(tmp_path: Path) -> None:
    # A v1 step as the previous release wrote it (no problems/rank/world_size keys) reads back.
    w = step_to_wire(_step("mlp"))
    for key in ("problems", "not_in_step", "rank", "world_size"):
        del w[key]
    st = step_from_wire(unpack(pack(w)))
    assert st.problems == [] and st.not_in_step == [] and st.rank is None and st.world_size is None


def test_random_mutations_raise_only_trace_format_error(wires: list[dict[str, Any]], tmp_path: Path) -> None:
    rng = random.Random(1234)
    rejected = accepted = 0
    store = TraceStore(tmp_path / "fuzz.sqlite")
    thin = [_thin(w) for w in wires]
    paths = [[p for p in _paths(w) if p] for w in thin]
    for k in range(2000):
        bad = _mutate(thin[k % len(thin)], paths[k % len(thin)], rng)
        try:
            st = step_from_wire(bad)
        except TraceFormatError as exc:
            assert str(exc), "an error must name what was wrong"
            rejected += 1
            continue
        accepted += 1
        if accepted % 20 == 0:  # what decodes can be stored and served, as the server does
            canonical = step_to_wire(st)
            write_maps(store, canonical)
            graph_json(store.read_graph(st.run, st.step))
    store.close()
    assert rejected > 700 and accepted > 100, (rejected, accepted)


def test_the_fast_read_builds_what_the_checked_read_does_or_leaves_it(wires: list[dict[str, Any]]) -> None:
    """NOTE [Fast read]: on real steps every node and array-less tensor takes the fast path and comes out
    equal to the checked reader's; on mutated ones the fast path never accepts what the checked reader
    rejects, and what it accepts is equal."""
    from gradscape.tracer.wire import fast_read
    from gradscape.tracer.wire.earlier import fast_nodes
    from gradscape.tracer.wire.earlier.maps_step import _node
    from gradscape.tracer.wire.validation import Refs

    def both(wire: dict[str, Any]) -> tuple[int, int]:
        fast_tensors = [fast_read.tensor(t) for t in wire["tensors"]]
        try:
            tensors = [tensor_from_wire(t, f"tensors[{i}]") for i, t in enumerate(wire["tensors"])]
        except TraceFormatError:
            assert all(f is None for f, t in zip(fast_tensors, wire["tensors"]) if not _tensor_ok(t))
            return 0, 0
        assert all(f is None or _same_tensor(f, t) for f, t in zip(fast_tensors, tensors))
        refs, fast = Refs(tensors, len(wire["nodes"])), 0
        for k, n in enumerate(wire["nodes"]):
            got = fast_nodes.node(n, k, tensors)
            try:
                want = _node(n, k, refs)
            except TraceFormatError:
                assert got is None, (k, n)
                continue
            assert got is None or got == want
            fast += got is not None
        return fast, sum(f is not None for f in fast_tensors)

    summary = unpack(pack(step_to_wire(_step("cnn"))))
    assert both(summary) == (len(summary["nodes"]), len(summary["tensors"]))  # all of a real step, fast
    rng = random.Random(7)
    paths = [p for p in _paths(summary) if p and p[0] in ("nodes", "tensors")]
    took = 0
    for _ in range(600):
        took += both(_mutate(summary, paths, rng))[0]
    assert took > 0


def _same_tensor(a: Any, b: Any) -> bool:
    def same(x: Any, y: Any) -> bool:
        return (x is None and y is None) or (x is not None and y is not None and x.dtype == y.dtype
                                             and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"))
    return ((a.shape, a.dtype, a.thumb_view, a.device) == (b.shape, b.dtype, b.thumb_view, b.device)
            and list(a.stats) == list(b.stats)
            and all(x == y or (x != x and y != y) for x, y in zip(a.stats.values(), b.stats.values()))
            and same(a.thumb, b.thumb) and same(a.values, b.values))


def _tensor_ok(t: Any) -> bool:
    try:
        tensor_from_wire(t)
        return True
    except TraceFormatError:
        return False


def test_mutated_bytes_raise_only_trace_format_error(wires: list[dict[str, Any]]) -> None:
    rng = random.Random(99)
    blob = pack(wires[1])
    for _ in range(1500):
        b = bytearray(blob)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        if rng.random() < 0.2:
            b = b[:rng.randrange(len(b))]
        with contextlib.suppress(TraceFormatError):
            step_from_wire(unpack(bytes(b)))


@pytest.mark.parametrize(("path", "value", "named"), [
    (("modules",), [1], "modules: expected a map"),
    (("modules", "fc1"), 3, "modules['fc1']: expected a map"),
    (("modules", "fc1", "calls"), [{"in": [99999]}], "modules['fc1'].calls[0].in"),
    (("passes",), [7], "passes[0]: expected a map"),
    (("passes", 0, "roots"), None, "passes[0].roots"),
    (("passes", 0, "index"), "0", "passes[0].index"),
    (("execution",), [[1]], "execution[0]"),
    (("execution",), [[10 ** 6, 0]], "execution[0]"),
    (("nodes", 1, "runs"), [[0]], "nodes[1].runs[0]"),
    (("nodes", 1, "labels"), [3], "nodes[1].labels[0]"),
    (("nodes", 1, "in_shapes"), [["a"]], "nodes[1].in_shapes[0]"),
    (("nodes", 1, "order"), "first", "nodes[1].order"),
    (("nodes", 1, "gi"), [10 ** 6], "nodes[1].gi[0]"),
    (("step",), 2 ** 64 - 1, "step"),
    (("meta",), {"k": b"\x00"}, "meta.k"),
    (("v",), True, "wire version"),
    (("not_in_step",), ["fc1.weight", 3], "not_in_step[1]"),
])
def test_malformed_fields_are_named(wires: list[dict[str, Any]], path: tuple[Any, ...], value: Any,
                                    named: str) -> None:
    w = copy.deepcopy(wires[0])
    parent = w
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = value
    with pytest.raises(TraceFormatError) as info:
        step_from_wire(w)
    assert named in str(info.value)


def test_arrays_keep_their_values() -> None:
    # tensors="full": each parameter's gradient comes back from the wire with torch's own values, bit for bit
    case = build("mlp")
    tr = gradscape.Tracer(case.model, run="values", tensors="full")
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    assert st is not None
    back = step_from_wire(unpack(pack(step_to_wire(st))))
    grads = {name: p.grad for name, p in case.model.named_parameters()}
    assert set(back.params) == set(grads) and grads
    for name, t in back.params.items():
        g = grads[name]
        assert g is not None and t.values is not None, name
        assert t.values.dtype == np.float32 and t.values.shape == tuple(g.shape), name
        np.testing.assert_array_equal(t.values, g.numpy())
