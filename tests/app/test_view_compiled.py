"""What a step says of torch.compile on the page (`app.view.compiled`), on real traces: its notes, the
compare table's rows and the colouring by compiled − eager difference (NOTE [Difference colouring]).

The comparison here is the tracer's own `differences` of gradients made up in the test (a parameter equal,
one off by a known amount, one with a NaN, one the compiled run gave none to), so every kind of row is
there and each number is known; tests/e2e/test_compiled_page.py has a real compiled model's."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from earlier_release import step_to_wire

import gradscape
from gradscape.app.view import DIFF, compare_rows, cytoscape_elements, has_comparison, layout_graph, step_notes
from gradscape.app.view.colours import MISSING_COLOR
from gradscape.app.view.compiled import DIFF_SCALE, ZERO_DIFF, diff_range
from gradscape.app.view.marks import step_marks
from gradscape.tracer.record.compare import differences

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo's own notes on what it compiles


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def traced(net: Any, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    with gradscape.Tracer(net, monitor=False) as tr, tr.step(0) as st:
        F.cross_entropy(net(x), y).backward()
    st.meta.update(meta or {})
    return step_to_wire(st)


@pytest.fixture(scope="module")
def compared_bias() -> tuple[dict[str, Any], tuple[float, float, float]]:
    """An eager step carrying a comparison: 0.weight equal, 0.bias 1e-3 off at [5], 2.weight with a NaN, no
    compiled gradient for 2.bias."""
    net = model()
    eager = {n: torch.randn_like(p) for n, p in net.named_parameters()}
    compiled: dict[str, torch.Tensor | None] = {n: g.clone() for n, g in eager.items()}
    compiled["0.bias"][5] += 1e-3  # type: ignore[index]
    compiled["2.weight"][1, 2] = math.nan  # type: ignore[index]
    compiled["2.bias"] = None
    meta = differences(compiled, dict(eager), (torch.tensor(1.5), torch.tensor(1.25)))
    c, e = compiled["0.bias"], eager["0.bias"]
    assert c is not None
    return traced(net, {"compare_compiled": meta}), (float(c[5].double() - e[5].double()), float(c[5]), float(e[5]))


@pytest.fixture
def compared(compared_bias: tuple[dict[str, Any], Any]) -> dict[str, Any]:
    return compared_bias[0]


def test_a_compiled_models_traced_step_says_it_ran_eagerly_and_an_eager_one_says_nothing() -> None:
    net = model()
    cm = torch.compile(net, backend="aot_eager")
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    F.cross_entropy(cm(x), y).backward()  # compiled, untraced
    with gradscape.Tracer(cm, monitor=False) as tr, tr.step(0) as st:
        F.cross_entropy(cm(x), y).backward()
    assert [(n["kind"], n["text"]) for n in step_notes(step_to_wire(st))] == \
        [("compiled", "ran eagerly for tracing (compiled model)")]
    assert step_notes(traced(model())) == []
    assert not has_comparison(step_to_wire(st))


def loss_trigger_step(detached: bool) -> dict[str, Any]:
    """The step a NaN loss (step 2: a NaN in the batch) traced through its trigger; `detached`: a loss on the
    model's outputs cut from it, which cannot be replayed."""
    net = model()
    with gradscape.Tracer(net, every=10 ** 6) as tr:
        for i in (1, 2):
            x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
            if i == 2:
                x[0, 0] = math.nan
            with tr.step(i):
                out = net(x)
                F.cross_entropy(out.detach().requires_grad_() if detached else out, y).backward()
    (st,) = tr.steps
    return step_to_wire(st)


def test_replayed_and_refused_replays_say_so() -> None:
    assert [(n["kind"], n["text"]) for n in step_notes(loss_trigger_step(False))] == [("replay", "replayed eagerly")]
    (note,) = step_notes(loss_trigger_step(True))
    assert note["kind"] == "replay-refused" and note["text"].startswith("not replayed: ")
    assert "does not depend" in note["text"]  # the tracer's reason, as it gave it


def test_a_compiled_region_kept_whole_says_so() -> None:
    net = model()
    cm = torch.compile(net, backend="aot_eager")
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    with gradscape.Tracer(cm, compiled="opaque", monitor=False) as tr, tr.step(0) as st:
        F.cross_entropy(cm(x), y).backward()
    assert [n["text"] for n in step_notes(step_to_wire(st))] == ["compiled regions kept whole"]


def test_rows_put_the_missing_first_then_the_largest_difference(compared_bias: tuple[dict[str, Any], Any]) -> None:
    compared, (diff, c, e) = compared_bias
    rows = compare_rows(compared)
    assert [r["param"] for r in rows] == ["2.bias", "2.weight", "0.bias", "0.weight"]
    assert rows[0]["missing"] == "compiled" and rows[0]["cells"][1:] == ["no compiled gradient", "—", "—", "—", "—"]
    assert rows[1]["max_abs"] == math.inf and rows[1]["cells"][1] == "inf" and rows[1]["at"] == [1, 2]
    assert math.isnan(rows[1]["compiled"]) and rows[1]["cells"][4] == "nan"
    assert (rows[2]["max_abs"], rows[2]["compiled"], rows[2]["eager"], rows[2]["at"]) == (abs(diff), c, e, [5])
    assert rows[3]["max_abs"] == 0.0 and rows[3]["cells"][1:3] == ["0", "0"]
    assert "compiled vs eager" in step_notes(compared)[-1]["text"]


def test_no_rows_and_no_colouring_without_a_comparison() -> None:
    wire = traced(model())
    assert compare_rows(wire) == [] and not has_comparison(wire)
    marks = step_marks(wire, DIFF)
    assert set(marks.values) == {None} and marks.worst is None


def test_the_graph_is_coloured_by_the_difference(compared_bias: tuple[dict[str, Any], Any]) -> None:
    compared, (diff, _, _) = compared_bias
    els = cytoscape_elements(compared, layout_graph(compared), DIFF)
    params = {e["data"]["param"]: e for e in els if e["group"] == "nodes" and e["data"].get("param")}
    assert set(params) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert params["0.weight"]["data"]["fill"] == ZERO_DIFF  # equal: neutral
    assert params["2.weight"]["data"]["fill"] == DIFF_SCALE[-1]  # NaN: infinite, the top of the scale
    assert params["2.bias"]["data"]["fill"] == DIFF_SCALE[-1]  # no compiled gradient: as far as can be
    assert params["0.bias"]["data"]["fill"] == DIFF_SCALE[3]  # the one finite difference: a decade around it
    # the worst named by the comparison (the largest finite-or-not max_abs among those both runs gave)
    assert [p for p, e in params.items() if "worstdiff" in e["classes"]] == ["2.weight"]
    ops = [e for e in els if e["group"] == "nodes" and e["data"].get("kind") == "op"]
    assert ops and {e["data"]["fill"] for e in ops} == {MISSING_COLOR}
    assert "max |compiled − eager|" in params["0.bias"]["data"]["title"]
    lo, hi = diff_range([abs(diff)])
    assert step_marks(compared, DIFF).legend["min_label"] == f"{10 ** lo:.2g}"
    assert [k["name"] for k in step_marks(compared, DIFF).legend["key"]] == ["0: equal", "no parameter"]


def test_a_folded_module_shows_its_largest_difference(compared_bias: tuple[dict[str, Any], Any]) -> None:
    compared, (diff, _, _) = compared_bias
    folded = {e["data"]["module"]: e for e in cytoscape_elements(compared, layout_graph(compared, ["0", "2"]), DIFF)
              if e["group"] == "nodes" and "collapsed" in e["classes"]}
    assert folded["0"]["data"]["value"] == abs(diff) and folded["2"]["data"]["value"] == math.inf
    assert "largest max |compiled − eager| inside" in folded["0"]["data"]["title"]


def test_no_worst_is_marked_when_every_difference_is_zero() -> None:
    net = model()
    grads = {n: torch.randn_like(p) for n, p in net.named_parameters()}
    wire = traced(net, {"compare_compiled": differences(dict(grads), dict(grads), (None, None))})
    els = cytoscape_elements(wire, layout_graph(wire), DIFF)
    params = [e for e in els if e["group"] == "nodes" and e["data"].get("param")]
    assert len(params) == 4 and {e["data"]["fill"] for e in params} == {ZERO_DIFF}
    assert not [e for e in params if "worstdiff" in e["classes"]]
    assert step_notes(wire)[-1]["text"].endswith("(equal)")
