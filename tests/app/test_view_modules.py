"""The module tab (`app.view.modules`), checked against PyTorch's own module hooks."""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from earlier_release import step_to_wire
from zoo import build

import gradscape
from gradscape.app.view import backward_hook_note, module_detail, module_table, module_tensors, param_rows


def traced(name: str) -> tuple[dict[str, Any], Any]:
    case = build(name)
    tr = gradscape.Tracer(case.model, tensors="full")
    with tr.step(0) as st:
        case.loss(case.model, case.batch).backward()
    return step_to_wire(st), case


def hooked(name: str, module: str, full: bool) -> list[list[torch.Tensor | None]]:
    """Run the same model and batch untraced with a real module backward hook on `module`."""
    case = build(name)
    got: list[list[torch.Tensor | None]] = []
    target = case.model.get_submodule(module)

    def hook(m: Any, grad_input: Any, grad_output: Any) -> None:
        got.append([None if g is None else g.detach().clone() for g in grad_input])
        got.append([None if g is None else g.detach().clone() for g in grad_output])

    with warnings.catch_warnings():
        # the point of the comparison: the deprecated hook, which torch warns about
        warnings.simplefilter("ignore", FutureWarning)
        handle = target.register_full_backward_hook(hook) if full else target.register_backward_hook(hook)
        try:
            case.loss(case.model, case.batch).backward()
        finally:
            handle.remove()
    return got


@pytest.fixture(scope="module")
def mlp() -> dict[str, Any]:
    return traced("mlp")[0]


def test_grad_input_and_output_match_full_backward_hooks(mlp: dict[str, Any]) -> None:
    detail = module_detail(mlp, "fc2")
    grad_input, grad_output = hooked("mlp", "fc2", full=True)
    (call,) = detail["calls"]
    assert [row["shape"] for row in call["grad_input"]] == [list(g.shape) for g in grad_input]
    assert [row["shape"] for row in call["grad_output"]] == [list(g.shape) for g in grad_output]
    assert call["grad_input"][0]["norm"] == pytest.approx(grad_input[0].norm().item(), rel=1e-5)
    assert call["grad_output"][0]["norm"] == pytest.approx(grad_output[0].norm().item(), rel=1e-5)
    assert detail["type"] == "Linear"


def test_backward_hook_note_is_what_the_deprecated_hook_returned(mlp: dict[str, Any]) -> None:
    note = backward_hook_note(mlp, "fc2")
    old_input, _ = hooked("mlp", "fc2", full=False)
    assert [s["shape"] for s in note["slots"]] == [list(g.shape) for g in old_input]  # bias, input, weightᵀ
    last = mlp["nodes"][mlp["modules"]["fc2"]["calls"][0]["last"]]
    assert note["node"] == f"n{last['id']}" and note["name"] == "AddmmBackward0"
    assert [s["label"] for s in note["slots"]] == last["labels"]
    assert "self → fc2.bias [30], mat1 → input of fc2 [8×20], mat2 → fc2.weight (transposed) [20×30]" in note["text"]
    assert "register_full_backward_hook gives grad_input = ([8×20])" in note["text"]
    for s, g in zip(note["slots"], old_input):
        t = mlp["tensors"][s["tensor"]]
        assert t["stats"][4] == pytest.approx(g.norm().item(), rel=1e-5)


def test_param_rows_are_the_parameter_gradients() -> None:
    wire, _ = traced("mlp")
    case = build("mlp")
    case.loss(case.model, case.batch).backward()
    rows = {r["name"]: r for r in param_rows(wire, "fc2")}
    assert set(rows) == {"fc2.weight", "fc2.bias"}
    for name, row in rows.items():
        g = case.model.get_parameter(name).grad
        assert row["shape"] == list(g.shape)
        assert row["norm"] == pytest.approx(g.norm().item(), rel=1e-5)
        assert row["maxabs"] == pytest.approx(g.abs().max().item(), rel=1e-6)
        assert row["rms"] == pytest.approx((g.pow(2).mean().sqrt()).item(), rel=1e-5)
        assert wire["nodes"][int(row["node"][1:])]["param"] == name


def test_module_never_called_and_table() -> None:
    wire, _ = traced("transformer")
    note = backward_hook_note(wire, "attn.out_proj")  # MultiheadAttention uses its weights directly
    assert note["node"] is None and "never called" in note["text"]
    table = module_table(wire)
    assert [r["module"] for r in table] == list(wire["modules"])
    head = next(r for r in table if r["module"] == "head")
    assert head["grad_output"] == "[2×5×11]" and head["params"] == 2
    with pytest.raises(KeyError, match="no module"):
        module_detail(wire, "nope")


def test_module_calls_carry_heatmap_slots_of_the_real_gradients(mlp: dict[str, Any]) -> None:
    """grad_input/grad_output of each call as the node tab shows slots: a heatmap of the values the
    full backward hook saw, a label, the shape and statistics to 4 significant digits."""
    arrays = {i: mlp["tensors"][i] for i in module_tensors(mlp, "fc2")}
    detail = module_detail(mlp, "fc2", arrays)
    grad_input, grad_output = hooked("mlp", "fc2", full=True)
    slots = detail["calls"][0]["slots"]
    for got, want, label in ((slots["grad_input"][0], grad_input[0], "∂L/∂input 0"),
                             (slots["grad_output"][0], grad_output[0], "∂L/∂output 0")):
        assert got["label"].startswith(label) and got["shape"] == list(want.shape)
        z = np.array(got["figure"]["data"][0]["z"], dtype=np.float64)
        np.testing.assert_allclose(z, want.double().numpy(), rtol=1e-5, atol=1e-7)
        norm = next(r for r in got["stats"] if r["stat"] == "norm")
        assert norm["text"] == f"{want.norm().item():.4g}" or norm["text"] == f"{want.norm().item():.3e}"


def test_param_table_is_display_ready(mlp: dict[str, Any]) -> None:
    table = module_detail(mlp, "fc2")["param_table"]
    assert table["columns"][:3] == ["parameter", "shape", "‖g‖₂"]
    assert "index" not in table["columns"] and "tensor" not in table["columns"] and "text" not in table["columns"]
    weight = next(r for r in table["rows"] if r[0] == "fc2.weight")
    assert weight[1] == "[30×20] float32"
    for cell in weight[2:6]:  # numbers: at most 4 significant digits
        digits = re.sub(r"e[-+]\d+$", "", cell).lstrip("-").replace(".", "").lstrip("0")
        assert len(digits) <= 4, cell
