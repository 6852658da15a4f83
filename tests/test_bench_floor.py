"""bench/floor.py: its floor modes do the work they stand for (the extension walks and hooks every node of
the step, and records every run a traced step records, over each of a loop's backward calls), they train as
the plain step does, and the benchmark prints a ratio for each mode."""

from __future__ import annotations

import re

import pytest
import torch

from bench import floor


@pytest.mark.parametrize("mode", ["native", "bare"])
def test_the_native_floor_records_every_node_of_the_step(mode: str) -> None:
    f = floor.Floor("W1")
    f.run("traced")
    nodes = f.tr.last.meta["nodes"]  # the same step as gradscape traces it
    with f.installed(mode):
        f.run(mode)
    f.tr.close()
    assert f.recorded == (nodes, nodes)  # every node walked, and each ran once


@pytest.mark.parametrize(("key", "passes"), [("gan", 3), ("forward_forward", 4)])
def test_a_loops_floor_records_each_backward_call_and_trains_as_plain(key: str, passes: int) -> None:
    f, plain = floor.Floor(key), floor.Floor(key)
    try:
        f.run("traced")
        st = f.tr.last
        plain.run("plain")
        with f.installed("bare"):
            f.run("bare")
        plain.run("plain")
    finally:
        f.tr.close()
        plain.tr.close()
    assert f.passes == len(st.passes) == passes
    assert f.recorded == (len(st.nodes), len(st.execution))  # every node walked; every run of every call
    for (n, p), q in zip(plain.model.named_parameters(), f.model.parameters()):
        assert torch.equal(p, q), n  # the floor changed nothing the steps computed


def test_the_benchmark_prints_a_ratio_for_each_mode(capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    try:
        assert floor.main(["--workloads", "W6", "--rounds", "1", "--steps", "3"]) == 0
    finally:  # the benchmark runs on one thread; the tests after this one run as they would without it
        torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith("W6")
    assert len(re.findall(r"\d+\.\d+x", row)) == len(floor.MODES) - 1
