"""bench/pernode.py: the per-node curve is of carried steps (the steps a training loop makes after its first
few: a new graph's warm-up steps are left out), and the benchmark prints a row for each size."""

from __future__ import annotations

import re

import pytest
import torch

from bench import pernode


def test_the_curve_times_steps_after_the_warm_up_which_are_carried() -> None:
    """The warm-up's first two traced steps record the forward with the function mode; the third and every
    step after it are carried (no mode): those are what the curve times."""
    loop = pernode.Loop(300)
    moded: list[bool] = []
    step = loop.step

    def spy() -> None:
        moded.append(torch._C._len_torch_function_stack() > 0)
        step()

    loop.step = spy  # type: ignore[method-assign]
    for _ in range(pernode.WARM_TRACED + 2):
        loop.traced()
    loop.tr.close()
    assert moded == [True, True, False, False, False]
    assert loop.recorder == "native" and loop.nodes > 250


def test_the_benchmark_prints_a_row_for_each_size(capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    try:
        assert pernode.main(["--nodes", "200,400", "--rounds", "1"]) == 0
    finally:  # the benchmark runs on one thread; the tests after this one run as they would without it
        torch.set_num_threads(threads)
    rows = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\s+\d+\s+native \|", line)]
    assert [int(r.split()[0]) for r in rows] == [pytest.approx(200, abs=20), pytest.approx(400, abs=20)]
    for r in rows:  # wall and CPU time: each a ratio and a cost a node
        assert len(re.findall(r"\d+\.\d+x", r)) == 2
