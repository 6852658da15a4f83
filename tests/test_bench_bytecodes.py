"""bench/bytecodes.py: it counts the Python a step runs, gradscape's apart, and says which loops it takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import bytecodes


def test_a_traced_step_counts_gradscapes_python_and_a_plain_step_none() -> None:
    plain, traced = bytecodes.count("W1", "plain", 2), bytecodes.count("W1", "traced", 2)
    ours = [code for code in traced.ops if bytecodes._ours(code) is not None]
    assert not [code for code in plain.ops if bytecodes._ours(code) is not None]
    assert sum(traced.ops.values()) > sum(plain.ops.values()) > 0
    assert any(code.co_name == "finish" and "recorder.py" in code.co_filename for code in ours)  # the step's end
    assert all(not bytecodes._ours(code).startswith(("bench", "tests")) for code in ours)  # type: ignore[union-attr]
    unmonitored = bytecodes.count("W1", "unmonitored", 2)  # the recorder without the monitor's full step
    assert sum(plain.ops.values()) < sum(unmonitored.ops.values()) < sum(traced.ops.values())
    assert not [code for code in unmonitored.ops if Path(code.co_filename).parts[-2:] == ("monitor", "monitor.py")]
    lines = bytecodes.report("W1", "traced", traced, 2, top=3)
    assert "bytecodes a step, gradscape's" in lines[0] and len(lines) == 1 + 3 + 1 + 3


def test_a_loop_it_does_not_know_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="'nope' is neither a loop of bench/loops.py"):
        bytecodes.main(["--loops", "nope"])
    with pytest.raises(SystemExit, match="--modes: 'fast' is not one of plain, monitor, traced, unmonitored"):
        bytecodes.main(["--modes", "fast"])
