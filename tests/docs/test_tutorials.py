"""Every tutorial of docs/tutorials/ runs its script of examples/, which checks its answer against torch
(torch.autograd.grad, real hooks, p.grad, an untraced twin); here the test also checks that the script
prints what the page says it prints, and the claims the page makes in words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from docs_pages import DOCS, ROOT, example, printed_block

TUTORIALS = DOCS / "tutorials"


def _run(name: str, capsys: pytest.CaptureFixture[str]) -> tuple[Any, list[str]]:
    result = example(name).main()
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    return result, lines


def _prints_what_the_page_shows(page: str, lines: list[str]) -> None:
    shown = printed_block(TUTORIALS / page)
    missing = [line for line in shown if line not in lines]
    assert not missing, f"{page} shows lines the script did not print: {missing}"


def test_module_hooks(capsys: pytest.CaptureFixture[str]) -> None:
    result, lines = _run("module_hooks", capsys)
    assert result["labels"] == ["self → fc2.bias", "mat1 → input of fc2", "mat2 → fc2.weight (transposed)"]
    assert result["modules"] == {"fc2": "Linear", "conv2": "Conv2d"}
    _prints_what_the_page_shows("module-hooks.md", lines)


def test_old_backward_hook(capsys: pytest.CaptureFixture[str]) -> None:
    result, lines = _run("old_backward_hook", capsys)
    # the shapes of the forum question: bias [10], input [64, 84], weight.T [84, 10]
    assert result["old_shapes"] == [(10,), (64, 84), (84, 10)] and result["full_shape"] == (64, 84)
    assert [label.split(" → ")[0] for label in result["old_labels"]] == ["self", "mat1", "mat2"]
    assert result["last_op"] == "AddmmBackward0"
    _prints_what_the_page_shows("old-backward-hook.md", lines)


def test_vjp(capsys: pytest.CaptureFixture[str]) -> None:
    result, lines = _run("vjp_outer", capsys)
    assert result["x_grad"] == [2.0, 1.0, 0.0]  # (x1, x0, 0), as the page works out by hand
    assert result["apis"] == ["Tensor.backward", "autograd.grad"]
    _prints_what_the_page_shows("vjp.md", lines)


def test_nan(capsys: pytest.CaptureFixture[str]) -> None:
    result, lines = _run("nan_hunt", capsys)
    assert result["kinds"] == ["nonfinite_forward", "nonfinite_loss", "nonfinite_backward"]
    assert result["node"] == "SqrtBackward0"
    _prints_what_the_page_shows("nan.md", lines)
    assert f"`{result['source']}`" in (TUTORIALS / "nan.md").read_text()


def test_loss_spike(capsys: pytest.CaptureFixture[str]) -> None:
    result, lines = _run("loss_spike", capsys)
    assert (result["step"], result["trigger"], result["param"]) == (31, "loss_spike", "4.bias")
    _prints_what_the_page_shows("loss-spike.md", lines)


@pytest.mark.slow
def test_breakpoints(capsys: pytest.CaptureFixture[str]) -> None:
    result, lines = _run("live_breakpoints", capsys)
    paused, again = result["paused"], result["again"]
    assert paused["node"]["name"] == "AddmmBackward0" and paused["node"]["module"] == "fc2"
    assert again["executed"] == paused["executed"] + 1 and again["step"] == paused["step"]
    assert result["steps"] >= paused["step"] + 5  # training went on after `continue`
    # the page's output, but for the numbers that depend on when the tracer's link came up
    assert "parameters after the run: bitwise those of a run that never paused" in lines
    assert any(line.startswith("paused at step ") and "AddmmBackward0 (module fc2, live_breakpoints.py:" in line
               for line in lines)


@pytest.mark.slow
def test_ddp(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("no gloo backend")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the ranks import this tree's gradscape
    result, lines = _run("ddp_two_ranks", capsys)
    assert result["ranks"] == [0, 1] and result["world_size"] == 2
    _prints_what_the_page_shows("ddp.md", lines)


def test_every_tutorial_page_is_tested_and_includes_its_script() -> None:
    tested = {name[5:] for name in globals() if name.startswith("test_") and name != "test_every_tutorial_page_is_"
              "tested_and_includes_its_script"}
    pages = {p.stem.replace("-", "_") for p in TUTORIALS.glob("*.md")}
    assert pages == {"module_hooks", "old_backward_hook", "vjp", "nan", "loss_spike", "breakpoints", "ddp"}
    assert pages <= tested
    for page in TUTORIALS.glob("*.md"):
        included = [line.split('"')[1] for line in page.read_text().splitlines() if line.startswith('--8<-- "')]
        assert len(included) == 1 and (ROOT / included[0]).is_file() and included[0].startswith("examples/"), page
        assert Path(included[0]).stem in {"module_hooks", "old_backward_hook", "vjp_outer", "nan_hunt",
                                          "loss_spike", "live_breakpoints", "ddp_two_ranks"}
