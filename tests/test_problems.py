"""The problem finder (`StepTrace.problems`, docs/problems.md): where a NaN was born, a non-finite loss,
a backward-born Inf, parameters without a gradient, exploding layers and dead ReLUs; through the
tracer, and through the JSON API of a real server over a real SQLite file. Expected values come from
torch itself (`torch.autograd.grad`, the tensors' values), never from the tracer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
from problem_cases import (
    FFNet,
    WithUnused,
    forward_forward,
    line_of,
    log_of_negative,
    sqrt_at_zero,
    sqrt_of_sqrt,
    unused_layer,
)
from serving import Server, free_port
from zoo import ZOO, build

import gradscape

NONFINITE = ("nonfinite_forward", "nonfinite_loss", "nonfinite_backward")


def _kinds(st: gradscape.StepTrace) -> list[str]:
    return [p.kind for p in st.problems]


# ---------------------------------------------------------------------------------------------- tracer


def test_a_nan_born_in_the_inner_sqrt_is_blamed_on_its_line_not_the_outer_one() -> None:
    st = sqrt_of_sqrt(gradscape.Tracer())
    first = st.problems[0]
    assert first.kind == "nonfinite_forward"
    assert first.source == line_of("@inner-sqrt")
    assert first.node is not None and st.nodes[first.node].name == "SqrtBackward0"
    assert st.nodes[first.node].source == line_of("@inner-sqrt")
    assert "NaN" in first.message and "sqrt" in first.message
    # the loss is NaN, and the outer sqrt's backward poisoned the gradients after the origin
    assert _kinds(st)[:2] == ["nonfinite_forward", "nonfinite_loss"]
    born = [p for p in st.problems if p.kind == "nonfinite_backward"]
    assert born and born[0].source == line_of("@outer-sqrt")


def test_sqrt_at_zero_is_backward_born_and_the_forward_is_not_blamed() -> None:
    st = sqrt_at_zero(gradscape.Tracer())
    x = torch.tensor([0.0, 4.0], requires_grad=True)
    (g,) = torch.autograd.grad(torch.sqrt(x).sum(), x)
    assert torch.isinf(g[0])  # what torch computes: 1 / (2·sqrt(0))
    assert _kinds(st) == ["nonfinite_backward"]
    p = st.problems[0]
    assert p.source == line_of("@sqrt-at-zero") and p.node is not None
    assert st.nodes[p.node].name == "SqrtBackward0"
    assert "Inf" in p.message


def test_log_of_a_negative_number_is_a_nonfinite_loss_born_at_the_logline_of() -> None:
    st = log_of_negative(gradscape.Tracer())
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    loss = torch.log(-x).sum()
    (g,) = torch.autograd.grad(loss, x)
    assert torch.isnan(loss) and torch.isfinite(g).all()  # NaN loss, finite gradients: anomaly mode is silent
    assert _kinds(st) == ["nonfinite_forward", "nonfinite_loss"]
    born, bad_loss = st.problems
    assert born.source == line_of("@log") and born.node is not None
    assert st.nodes[born.node].name == "LogBackward0"
    assert bad_loss.node == st.passes[0].roots[0]
    assert "every gradient is finite" in bad_loss.message


def test_a_parameter_that_already_holds_nan_is_the_origin() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    with torch.no_grad():
        model[2].weight[0, 1] = float("nan")
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        model(torch.randn(2, 3)).sum().backward()
    assert st is not None
    first = st.problems[0]
    assert (first.kind, first.param) == ("nonfinite_forward", "2.weight")
    assert "already held NaN" in first.message


def test_an_input_that_already_holds_inf_is_the_origin() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Sigmoid())
    x = torch.randn(2, 3)
    x[1, 2] = float("inf")
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        loss = model(x).log().sum()  # addmm gives ±inf, sigmoid 0 and 1, log -inf
        loss.backward()
    assert st is not None
    first = st.problems[0]
    assert first.kind == "nonfinite_forward" and first.node is not None
    assert st.nodes[first.node].name == "AddmmBackward0" and st.nodes[first.node].module == "0"
    assert "'mat1'" in first.message and "Inf" in first.message


@pytest.mark.parametrize("name", ZOO)
def test_a_finite_model_has_no_nonfinite_or_missing_gradient_problem(name: str) -> None:
    case = build(name)
    tr = gradscape.Tracer(case.model)
    for i in range(3):
        with tr.step(i) as st:
            loss = case.loss(case.model, case.batch)
            loss.backward()
        assert st is not None and torch.isfinite(loss)
        assert [p for p in st.problems if p.kind in NONFINITE or p.kind == "no_grad"] == []


def test_an_unused_layer_and_a_cut_one_are_named_with_their_parameters() -> None:
    torch.manual_seed(0)
    model = WithUnused()
    st = unused_layer(gradscape.Tracer(model), model)
    missing = {p.param: p for p in st.problems if p.kind == "no_grad"}
    assert set(missing) == {"side.weight", "side.bias"}  # side ran and still got nothing: a problem
    assert st.not_in_step == ["spare.weight", "spare.bias"]  # spare took no part in the step: listed apart
    assert model.spare.weight.grad is None and model.side.weight.grad is None and model.fc1.weight.grad is not None
    assert missing["side.bias"].source == line_of("@side-cut")
    assert missing["side.bias"].message == ("side.bias got no gradient: side's output (made at "
                                            f"{line_of('@side-made')}) was cut from the graph by .detach() at "
                                            f"{line_of('@side-cut')}.")
    assert not [p for p in st.problems if p.kind in NONFINITE]


def test_autograd_grad_alone_expects_no_parameter_gradient() -> None:
    model = nn.Linear(3, 1)
    x = torch.randn(2, 3, requires_grad=True)
    tr = gradscape.Tracer(model)
    with tr.step(0) as st:
        torch.autograd.grad(model(x).sum(), x)
    assert st is not None and st.problems == []


def test_problems_are_listed_root_cause_first() -> None:
    st = sqrt_of_sqrt(gradscape.Tracer())
    kinds = _kinds(st)
    order = {"nonfinite_forward": 0, "nonfinite_loss": 1, "nonfinite_backward": 2, "no_grad": 3}
    assert kinds == sorted(kinds, key=order.__getitem__)


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_a_relu_that_passes_back_only_zeros_is_dead(recorder: str) -> None:
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every unit inactive for any input of this size
    tr = gradscape.Tracer(model, recorder=recorder)
    with tr.step(0) as st:
        model(torch.rand(8, 4)).sum().backward()
    assert st is not None and st.meta["recorder"] == recorder
    (dead,) = [p for p in st.problems if p.kind == "dead"]
    assert dead.node is not None and st.nodes[dead.node].name in ("ReluBackward0", "ThresholdBackward0")
    assert model[0].weight.grad is not None and bool((model[0].weight.grad == 0).all())


def test_dead_units_among_many_relus_are_the_same_on_both_recorders() -> None:
    """Twelve ReLUs, every third one dead (its input always negative), one with a gradient all zeros coming in
    (a dead unit is one that turns a live gradient into zeros): the native recorder's tables, read with numpy
    for so many, name the very nodes, with the same words, as the Python recorder's traces."""
    found = {}
    for recorder in ("native", "python"):
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for k in range(12):
            lin = nn.Linear(6, 6)
            if k % 3 == 1:
                with torch.no_grad():
                    lin.bias.fill_(-100.0)
            layers += [lin, nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(6, 1))
        tr = gradscape.Tracer(model, recorder=recorder)
        with tr.step(0) as st:
            model(torch.rand(8, 6)).sum().backward()
        assert st is not None and st.meta["recorder"] == recorder
        found[recorder] = [(p.node, p.message) for p in st.problems if p.kind == "dead"]
    assert found["native"] == found["python"]
    # the dead ReLUs after the last one: what reaches the earlier ones is all zeros, so they are not named
    assert len(found["native"]) == 1 and "100.0% of its elements" in found["native"][0][1]


@pytest.mark.parametrize("monitor", [True, False])
def test_a_layer_whose_gradient_jumps_far_above_its_history_is_exploding(monitor: bool) -> None:
    """No optimizer: `st.params` holds the gradients as the backward left them, read by the finder from the step's
    tensor table without their `TensorTrace`s made (`ParamGradients.held`), with the monitor and without it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(16, 4)
    tr = gradscape.Tracer(model, monitor=monitor)
    for i in range(8):
        scale = 1e5 if i == 7 else 1.0
        with tr.step(i) as st:
            (model(x).pow(2).mean() * scale).backward()
        assert st is not None
        if i < 7:
            assert [p for p in st.problems if p.kind in ("exploding", "vanishing")] == []
    exploding = {p.param for p in st.problems if p.kind == "exploding"}
    assert exploding == {"0.weight", "2.weight"}


@pytest.mark.parametrize("tensors", ["summary", "full"])
def test_a_layer_that_explodes_before_clipping_is_named_while_params_show_what_was_stepped(tensors: str) -> None:
    """The finder reads the gradients as the backward left them (before `clip_grad_norm_`), while `st.params`
    holds what the optimizer stepped with: the monitor's summaries replace the arrivals', which a natively
    recorded step then never makes (`ParamGradients.unmade`)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every step sees the same model
    x = torch.randn(16, 4)
    tr = gradscape.Tracer(model, tensors=tensors)
    for i in range(8):
        with tr.step(i) as st:
            (model(x).pow(2).mean() * (1e5 if i == 7 else 1.0)).backward()
            before = {n: float(p.grad.norm()) for n, p in model.named_parameters()}  # type: ignore[union-attr]
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            after = {n: float(p.grad.norm()) for n, p in model.named_parameters()}  # type: ignore[union-attr]
            opt.step()
            opt.zero_grad()
        assert st is not None and st.meta["recorder"].split()[0] == ("native" if tensors == "summary" else "python")
        assert [p.kind for p in st.problems if p.kind not in ("exploding", "vanishing")] == []  # no "no_grad"
        if i < 7:
            assert [p for p in st.problems if p.kind in ("exploding", "vanishing")] == []
    assert {p.param for p in st.problems if p.kind == "exploding"} == {"0.weight", "2.weight"}
    assert set(st.params) == set(after)
    for name, norm in after.items():  # clipped: far below what arrived
        assert st.params[name].stats["norm"] == pytest.approx(norm, rel=1e-5) and norm < before[name] / 1e3


def test_the_finder_does_not_change_what_autograd_computes() -> None:
    x = torch.tensor([1.0, 3.0], requires_grad=True)
    y = torch.sqrt(torch.sqrt(x - 2)).sum()
    (want,) = torch.autograd.grad(y, x)
    tr = gradscape.Tracer()
    x2 = torch.tensor([1.0, 3.0], requires_grad=True)
    with tr.step(0):
        torch.sqrt(torch.sqrt(x2 - 2)).sum().backward()
    assert x2.grad is not None
    assert torch.equal(torch.isnan(x2.grad), torch.isnan(want))
    assert torch.allclose(x2.grad[1], want[1])


# -------------------------------------------------------------------------------------------- JSON API


def test_the_step_document_of_the_json_api_has_the_problems(tmp_path: Path) -> None:
    store = tmp_path / "problems.sqlite"
    torch.manual_seed(0)
    model = WithUnused()
    tr = gradscape.Tracer(model, run="p", sink=str(store))
    steps = [sqrt_of_sqrt(tr, 0), sqrt_at_zero(tr, 1), log_of_negative(tr, 2), unused_layer(tr, model, 3)]
    tr.close()
    srv = Server(store, free_port()).start()
    try:
        for i, st in enumerate(steps):
            doc = srv.api(f"/api/runs/p/steps/{i}")
            want = [{"kind": p.kind, "message": p.message, "node": p.node, "param": p.param, "source": p.source}
                    for p in st.problems]
            assert doc["problems"] == want
            assert doc["not_in_step"] == st.not_in_step
        assert srv.api("/api/runs/p/steps/0")["problems"][0]["source"] == line_of("@inner-sqrt")
        kinds = [p["kind"] for p in srv.api("/api/runs/p/steps/2")["problems"]]
        assert [k for k in kinds if k in NONFINITE] == ["nonfinite_forward", "nonfinite_loss"]
        assert {p["param"] for p in srv.api("/api/runs/p/steps/3")["problems"] if p["kind"] == "no_grad"} == {
            "side.weight", "side.bias"}
        assert steps[0].not_in_step == [n for n, _ in model.named_parameters()]  # the model was not called
        assert steps[3].not_in_step == ["spare.weight", "spare.bias"]
    finally:
        srv.stop()


@pytest.mark.parametrize("monitor", [True, False])
def test_a_layer_far_below_the_others_is_vanishing(monitor: bool) -> None:
    torch.manual_seed(0)
    heads = nn.ModuleList(nn.Linear(4, 2) for _ in range(4))
    x = torch.randn(8, 4)
    tr = gradscape.Tracer(heads, monitor=monitor)
    with tr.step(0) as st:
        sum(h(x).pow(2).sum() * (1e-7 if k == 3 else 1.0) for k, h in enumerate(heads)).backward()
    assert st is not None
    norms = [float(torch.cat([p.grad.flatten() for p in h.parameters()]).norm()) for h in heads]  # type: ignore
    assert norms[3] < min(norms[:3]) / 1e3
    assert [(p.kind, p.param) for p in st.problems] == [("vanishing", "3.weight")]


def test_a_failing_finder_leaves_the_step_whole(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    import gradscape.tracer.record.debug.problems as finder

    def broken(*args: object) -> list[gradscape.Problem]:
        raise RuntimeError("finder broke")

    monkeypatch.setattr(finder, "backward_born", broken)  # a fault that cannot be produced for real
    st = sqrt_at_zero(gradscape.Tracer())
    assert st.problems == [] and st.nodes and st.error is None
    assert "finder broke" in caplog.text


def test_a_nan_loss_in_a_create_graph_backward_is_found_and_the_second_order_gradient_still_runs() -> None:
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with gradscape.Tracer().step(0) as st:
        loss = torch.log(-x).sum()
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        g.sum().backward()
    assert st is not None and x.grad is not None
    assert torch.allclose(x.grad, -1 / x.detach() ** 2)  # the gradient of sum(1/x), torch.log(-x)'s gradient
    assert [p.kind for p in st.problems][:2] == ["nonfinite_forward", "nonfinite_loss"]


class _Cuts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(3, 3)
        self.frozen = nn.Linear(3, 3)
        self.dropped = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.frozen(x)
        self.dropped(x)
        return self.used(x)


def test_a_layer_run_under_no_grad_and_one_whose_output_is_dropped_say_why() -> None:
    model = _Cuts()
    with gradscape.Tracer(model).step(0) as st:
        model(torch.randn(2, 3)).sum().backward()
    assert st is not None
    why = {p.param: p.message for p in st.problems if p.kind == "no_grad"}
    assert set(why) == {"frozen.weight", "frozen.bias", "dropped.weight", "dropped.bias"}
    line = f"test_problems.py:{_Cuts.forward.__code__.co_firstlineno + 2}"  # `self.frozen(x)`
    assert why["frozen.weight"] == f"frozen.weight got no gradient: it was used under torch.no_grad() (at {line}), " \
        "which records no graph to it."
    assert {p.source for p in st.problems if p.param in ("frozen.weight", "frozen.bias")} == {line}
    assert "never reached the loss: it is unused" in why["dropped.bias"]


@pytest.mark.parametrize("traced", [0, 1])
def test_layer_local_training_lists_the_other_layer_as_not_in_the_step(traced: int) -> None:
    """The forward-forward shape: each layer trained alone through `layer.forward`, one Tracer over the
    whole net, a block around one layer's step. The other layer's parameters took no part in the step:
    no problem, listed apart; the traced layer's ops are its own."""
    net = FFNet()
    other = 1 - traced
    for st in forward_forward(gradscape.Tracer(net), net, traced):
        assert st.problems == []
        assert st.not_in_step == [f"layers.{other}.weight", f"layers.{other}.bias"]
        assert set(st.params) == {f"layers.{traced}.weight", f"layers.{traced}.bias"}
        ops = [n for n in st.nodes if n.kind == "op"]
        inside = [n for n in ops if n.source in (line_of("@ff-norm"), line_of("@ff-mm"))]
        assert len([n for n in inside if n.name == "MmBackward0"]) == 2  # x_pos and x_neg
        assert all(n.module == (f"layers.{traced}.act" if n.name == "ReluBackward0" else f"layers.{traced}")
                   for n in inside), [(n.name, n.module) for n in inside]
        assert all(n.module is None for n in ops if n.source not in (line_of("@ff-norm"), line_of("@ff-mm")))
    assert "not in this step" in st.summary() and "layers" in st.summary()
