"""bench/light_floor.py: its C++ block reads each loss of the step, bit for bit what the loop's loss holds, and
leaves `Tensor.backward` as it found it; the benchmark prints a ratio for each mode. bench/light_phases.py times
each phase of light and plain steps."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import light_floor, light_phases


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("light-floor")
    return folder, light_floor.load_native(folder)


def test_the_native_block_reads_each_loss_and_puts_backward_back(built: tuple[Path, Any]) -> None:
    before = torch.Tensor.backward
    floor = light_floor.LightFloor("W1", built[1])
    try:
        (loss,) = floor.run("native", 3)
        assert floor.block.losses == [loss.item()]  # the last step's loss, as the C++ wrapper read it
        assert torch.Tensor.backward is before
        (loss,) = floor.run("row", 3)
        assert len(floor.rows) == 3 and floor.rows[-1][1:] == (loss.item(), 1e-3)
        assert torch.Tensor.backward is before
        floor.run("plain", 1)
        assert floor.block.losses == [loss.item()]  # outside a block nothing is read
    finally:
        floor.tr.close()
        floor.tr_py.close()


def test_the_benchmark_prints_a_ratio_for_each_mode(built: tuple[Path, Any],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    try:
        args = ["--workloads", "W6", "--rounds", "1", "--steps", "20", "--build", str(built[0])]
        assert light_floor.main(args) == 0
    finally:  # the benchmark runs on one thread; the tests after this one run as they would without it
        torch.set_num_threads(threads)
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith("W6")
    assert len(re.findall(r"\d+\.\d+x", row)) == len(light_floor.MODES) - 1


def test_the_phases_of_light_plain_and_floor_steps_are_timed(built: tuple[Path, Any]) -> None:
    """Every phase of every measured step of each mode is timed, the light steps are light (no norms) and read
    their losses, also after the floor's block had its own wrapper of `Tensor.backward` in place; the batches of rows
    ran and were timed; the phases add up to the whole step."""
    ph = light_phases.Phases("W6", built[1])
    try:
        ph.run("monitor", 100, keep=False)
        front = torch.Tensor.backward
        assert type(front).__name__ == "BackwardFront"  # (the monitor's own, as its steps left it)
        ph.run("floor", 64)
        assert torch.Tensor.backward is front
        ph.run("monitor", 64)
        ph.run("plain", 64)
        rows = ph.tr.history
    finally:
        ph.tr.close()
    for mode in ("monitor", "plain", "floor"):
        t = ph.times[mode]
        assert all(len(t[p]) == 64 for p in light_phases.PHASES)
        assert all(sum(t[p][k] for p in light_phases.PHASES[:-1]) <= t["whole"][k] for k in range(64))
    assert ph.block.losses and ph.drained > 0
    assert [r["step"] for r in rows] == list(range(1, 101)) + list(range(165, 229))
    assert not any(r["norms"] for r in rows[100:]) and all(len(r["losses"]) == 1 for r in rows[100:])
    med, per_step = light_phases.measure("W6", 2, 20, warm=40)
    assert set(med) == {"monitor", "plain"} and per_step >= 0 and med["plain"]["whole"] > 0
