"""Slot labels come from torch's derivatives table, and never crash without it."""

from __future__ import annotations

import pytest
import torch
from zoo import build

import tracer
from tracer import _derivatives, _labels


def test_shipped_table_covers_torch_nodes() -> None:
    table = _derivatives.derivatives_table()
    assert len(table) > 600
    assert table["AddmmBackward0"]["args"] == ["self", "mat1", "mat2"]
    assert table["CatBackward0"]["list"] == [True]
    assert _labels.slot_args("CatBackward0", "op", 3) == ["tensors[0]", "tensors[1]", "tensors[2]"]
    assert _labels.slot_args("NativeLayerNormBackward0", "op", 3) == ["input", "weight", "bias"]


def test_unknown_nodes_get_generic_labels() -> None:
    assert _labels.slot_args("NoSuchBackward7", "op", 2) == ["input 0", "input 1"]
    assert _labels.slot_args("AddmmBackward0", "op", 5) == [f"input {j}" for j in range(5)]  # a mismatch


def test_tracing_works_without_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_labels, "derivatives_table", lambda: {})
    case = build("mlp")
    tr = tracer.Tracer(case.model)
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    (addmm,) = [n for n in st.nodes if n.name == "AddmmBackward0" and n.module == "fc3"]
    assert addmm.input_labels == ["input 0 → fc3.bias", "input 1 → input of fc3", "input 2 → fc3.weight (transposed)"]


def test_in_place_write_into_a_view() -> None:
    x = torch.randn(2, 3, requires_grad=True)
    tr = tracer.Tracer()
    with tr.step(0) as st:
        z = x * 2
        z[0] = 5.0
        z.sum().backward()
    (cs,) = st.by_name("torch::autograd::CopySlices")
    assert cs.input_args[0].startswith("self (base")
    assert x.grad is not None and x.grad[0].tolist() == [0.0, 0.0, 0.0]
