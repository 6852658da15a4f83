"""The offline file's views of a loop (app/export/views.py): a module called many times opens into its
calls, as on the live page (`cell · call 3 of 70`, the first 50, then the rest), a call into its ops,
every fold and box drawn opens a view that is in the file, and every node of the step is drawn by one.
tests/e2e/test_export.py clicks through the same views in Chromium."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import gradscape

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.workloads import lstm_loop  # noqa: E402
from tests.app.test_export import _parts  # noqa: E402

CALLS = 70


@pytest.fixture(scope="module")
def loop_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    w = lstm_loop(CALLS * 17)  # 17 nodes a time step: 70 calls of the LSTMCell
    with gradscape.Tracer(w.model) as tr, tr.step(0) as st:
        w.loss(w.model, w.batch()).backward()
    path = st.to_html(tmp_path_factory.mktemp("loop") / "loop.html")
    data, _ = _parts(path.read_text(encoding="utf-8"))
    return st, data


def _drawn(view: dict[str, Any]) -> list[str]:
    return [e[0] for e in view["nodes"]]


def test_a_module_called_many_times_opens_into_its_calls_and_a_call_into_its_ops(
        loop_file: tuple[Any, dict[str, Any]]) -> None:
    st, data = loop_file
    states = data["states"]
    assert "m:cell" in _drawn(states[""]) and states[""]["opens"]["m:cell"] == "m:cell"
    opened = states["m:cell"]
    calls = [e for e in _drawn(opened) if e.startswith("c:cell#") and not e.endswith("#more")]
    assert sorted(calls, key=lambda e: int(e.split("#")[1])) == [f"c:cell#{k}" for k in range(1, 51)]
    assert data["elements"]["c:cell#17"]["label"].startswith(f"cell · call 17 of {CALLS}\n")
    # the calls not drawn yet: their words are this view's, and a click draws the rest
    more = next(e for e in opened["nodes"] if e[0] == "c:cell#more")
    assert more[5]["label"].startswith(f"cell · calls 51–{CALLS}")
    rest = states[opened["opens"]["c:cell#more"]]
    assert {f"c:cell#{k}" for k in range(51, CALLS + 1)} <= set(_drawn(rest))
    # call 3 opened: its own ops drawn, in module `cell`, none of them drawn in the view it was opened from
    three = states[opened["opens"]["c:cell#3"]]
    ops = {int(e[1:]) for e in _drawn(three) if e.startswith("n")} - {int(e[1:]) for e in _drawn(opened)
                                                                         if e.startswith("n")}
    assert len(ops) >= 10 and all(st.nodes[i].module == "cell" for i in ops)
    assert "c:cell#3" not in _drawn(three) and "c:cell#4" in _drawn(three)
    # its box folds the call back (the calls drawn), and then the module (the first view), as on the page
    assert three["opens"]["g:cell"] == "m:cell" and opened["opens"]["g:cell"] == ""
    assert "cell#3" in [b[0] for b in three["boxes"]] and three["opens"]["g:cell#3"] == "m:cell"  # the call's own


def test_every_fold_opens_a_view_in_the_file_and_every_node_is_drawn_by_one(
        loop_file: tuple[Any, dict[str, Any]]) -> None:
    st, data = loop_file
    states = data["states"]
    assert data["states_left_out"] == 0
    for key, view in states.items():
        folds = [e for e in _drawn(view) if not e.startswith("n")] + [f"g:{b[0]}" for b in view["boxes"]]
        assert set(view["opens"]) == set(folds), key
        assert all(target in states for target in view["opens"].values())
    # every node of the step: the view named for it draws it (a deep link or the player opens that one)
    assert sorted(map(int, data["show"])) == [n.id for n in st.nodes]
    for node, key in data["show"].items():
        assert f"n{node}" in _drawn(states[key])


def test_a_scan_of_a_thousand_ops_opens_into_runs_and_a_run_into_its_ops(tmp_path: Path) -> None:
    from tests.app.test_op_runs import STEPS, Model

    torch = pytest.importorskip("torch")
    model = Model()
    with gradscape.Tracer(model) as tr, tr.step(0) as st:
        model(torch.randn(STEPS, 2, 4)).pow(2).mean().backward()
    data, _ = _parts(st.to_html(tmp_path / "scan.html").read_text(encoding="utf-8"))
    states = data["states"]
    opened = states[states[""]["opens"]["m:scan"]]
    runs = [e for e in _drawn(opened) if e.startswith("o:scan#0.")]
    assert len(runs) >= 3 and data["elements"]["o:scan#0.2"]["label"].startswith("scan\nops 101–200 of ")
    second = states[opened["opens"]["o:scan#0.2"]]
    ops = {e for e in _drawn(second) if e.startswith("n")} - set(_drawn(opened))
    assert len(ops) == 100 and all(st.nodes[int(e[1:])].module == "scan" for e in ops)
    assert "o:scan#0.2" not in _drawn(second) and "o:scan#0.3" in _drawn(second)
    # a run opened from there shows only itself opened (one path at a time); the box folds the run back
    third = states[second["opens"]["o:scan#0.3"]]
    assert "o:scan#0.2" in _drawn(third) and "o:scan#0.3" not in _drawn(third)
    assert second["opens"]["g:scan"] == states[""]["opens"]["m:scan"]
    for key, view in states.items():
        folds = [e for e in _drawn(view) if not e.startswith("n")] + [f"g:{b[0]}" for b in view["boxes"]]
        assert set(view["opens"]) == set(folds), key
