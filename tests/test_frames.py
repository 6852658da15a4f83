"""A step as Arrow tables (tracer/frames.py, NOTE [Step tables for analysis]): read back from a trace file,
by either recorder, the numbers in them are torch's."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from zoo import build

import gradscape

pa = pytest.importorskip("pyarrow")
pc = pytest.importorskip("pyarrow.compute")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7)


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_tables_of_a_loaded_step_hold_torchs_gradients(tmp_path: Path, recorder: str) -> None:
    case = build("mlp")
    params = dict(case.model.named_parameters())
    path = tmp_path / "run.sqlite"
    tr = gradscape.Tracer(case.model, run="r", sink=str(path), recorder=recorder)
    with tr.step(0):
        loss = case.loss(case.model, case.batch)
        want = dict(zip(params, torch.autograd.grad(loss, list(params.values()), retain_graph=True)))
        loss.backward()
    tr.close()
    st = gradscape.load(path, step=0)

    nodes = st.nodes_table()
    assert nodes.num_rows == len(st.nodes)
    assert sorted(v for v in nodes.column("param").to_pylist() if v is not None) == sorted(params)
    assert nodes.column("name").to_pylist()[0] == "NllLossBackward0"

    grads = st.gradients_table()
    # what arrived at each parameter's AccumulateGrad is the parameter's gradient: torch's, norm for norm
    by_param = dict(zip(nodes.column("node").to_pylist(), nodes.column("param").to_pylist()))
    arrived = grads.filter(pc.equal(grads.column("direction"), "grad_output"))
    seen = set()
    for node, norm, shape in zip(arrived.column("node").to_pylist(), arrived.column("norm").to_pylist(),
                                 arrived.column("shape").to_pylist()):
        name = by_param.get(node)
        if name is None:
            continue
        seen.add(name)
        assert shape == list(want[name].shape), name
        assert _close(norm, float(want[name].double().norm())), name
    assert seen == set(params)

    # every node that ran sent on a grad_input row per gradient it sent, labelled as the page labels it
    sent = grads.filter(pc.equal(grads.column("direction"), "grad_input"))
    addmm = [n for n in st.nodes if n.name == "AddmmBackward0"]
    assert addmm
    labels = {(r["node"], r["slot"]): r["label"] for r in sent.select(["node", "slot", "label"]).to_pylist()}
    for n in addmm:
        for j, g in enumerate(n.grad_inputs or []):
            if g is not None:
                assert labels[(n.id, j)] == n.input_labels[j]

    table = st.params_table()
    norms = dict(zip(table.column("param").to_pylist(), table.column("norm").to_pylist()))
    assert set(norms) == set(params)
    for name, p in params.items():
        assert p.grad is not None and _close(norms[name], float(p.grad.double().norm())), name


def test_non_finite_counts_are_counts(tmp_path: Path) -> None:
    x = torch.tensor([1.0, -1.0, 0.0], requires_grad=True)
    tr = gradscape.Tracer()
    with tr.step(0) as st:
        torch.log(x).sum().backward()  # d/dx log x = 1/x: 1, -1, inf
    grads = st.gradients_table()
    assert grads.schema.field("inf").type == pa.int64() and grads.schema.field("norm").type == pa.float64()
    log = [r for r in grads.to_pylist() if r["name"] == "LogBackward0" and r["direction"] == "grad_input"]
    assert len(log) == 1 and log[0]["inf"] == 1 and log[0]["nan"] == 0 and log[0]["numel"] == 3


def test_without_pyarrow_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # pyarrow is installed here; an environment without it is made by hiding the module (import fails)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    case = build("mlp")
    st = gradscape.trace(case.loss(case.model, case.batch), case.model)
    with pytest.raises(ImportError, match="install pyarrow"):
        st.nodes_table()
