"""bench/loop_costs.py over bench/loops.py: each loop's step trains as its program does (the traced step
records every backward call it makes), and the benchmark prints a row for it."""

from __future__ import annotations

import pytest
import torch

from bench import loop_costs, loops


@pytest.mark.parametrize(("name", "passes"), [("gan", 3), ("dcgan", 3), ("forward_forward", 4), ("gpt_micro2", 2),
                                              ("rnn_clipped", 1)])
def test_a_traced_step_records_each_backward_and_trains_as_the_plain_one(name: str, passes: int) -> None:
    plain, traced = loops.LOOPS[name](), loops.LOOPS[name]()
    timed = loop_costs.Timed(traced)
    try:
        for _ in range(2):
            plain.step()
            timed.run("traced")
    finally:
        timed.close()
    assert timed.last is not None and len(timed.last.passes) == passes
    for (n, p), q in zip(plain.model.named_parameters(), traced.model.parameters()):
        assert torch.equal(p, q), n  # gradscape changed nothing the step computed


@pytest.mark.parametrize("clock", sorted(loop_costs.CLOCKS))
def test_the_benchmark_prints_a_row_per_loop(clock: str) -> None:
    row = loop_costs.measure("gcn", rounds=1, clock=clock)
    cells = row.split()
    assert cells[0] == "gcn" and cells[-1] in ("yes", "no") and int(cells[-2]) == 1
