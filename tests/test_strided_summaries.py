"""Gradients that are neither contiguous nor a 2-D transpose (permuted as attention's are, expanded, of more than
one kernel chunk) are summarised by the native recorder's kernel where they lie, with no copy, and the summaries
are bitwise those the Python recorder makes from a contiguous copy (NOTE [Strided gradients] in
tracer/record/csrc/summaries.h), in float32, bfloat16 and float16."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from earlier_release import step_to_wire
from helpers import untimed
from torch import nn

import gradscape
from gradscape.tracer.record import native


class _Strided(nn.Module):
    """Each term's gradient reaches a node as a strided tensor: PermuteBackward0's sends on the incoming gradient
    permuted back (4-D as attention's (B, H, T, D) from (B, T, H, D); 3-D of 9,600 elements, over two of the
    kernel's 4,096-element chunks; 5-D), SumBackward0's an expanded one (every stride 0)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = nn.Parameter(torch.randn(2, 6, 4, 16).to(dtype))
        self.big = nn.Parameter(torch.randn(8, 40, 30).to(dtype))
        self.five = nn.Parameter(torch.randn(2, 3, 4, 5, 6).to(dtype))

    def forward(self, others: list[torch.Tensor]) -> torch.Tensor:
        a = (self.attn.permute(0, 2, 1, 3) * others[0]).sum()
        b = (self.big.permute(2, 0, 1) * others[1]).sum()
        c = (self.five.permute(4, 0, 3, 1, 2) * others[2]).sum()
        return (a + b + c + self.attn.sum()).float()


def _others(dtype: torch.dtype, nan: bool) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    out = [torch.randn(s, generator=gen).to(dtype) for s in ((2, 4, 6, 16), (30, 8, 40), (6, 2, 5, 3, 4))]
    if nan:
        out[1][3, 2, 7] = float("nan")  # a chunk with a NaN: the kernel's masked path
        out[2][1, 0, 2, 1, 3] = float("inf")
    return out


def _step(recorder: str, dtype: torch.dtype, nan: bool) -> tuple[Any, Counter[str]]:
    """One traced step, and the aten ops the profiler saw run in its backward."""
    model = _Strided(dtype)
    tr = gradscape.Tracer(model, recorder=recorder, monitor=False)
    with tr.step(0) as st:
        loss = model(_others(dtype, nan))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            loss.backward()
    assert st is not None and st.meta["recorder"] == recorder
    return st, Counter(e.name for e in prof.events())


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan-inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_strided_gradients_are_read_in_place_as_their_copy_reads(dtype: torch.dtype, nan: bool) -> None:
    if not native.status()[0]:
        pytest.skip("no native recorder here")
    nat, ops = _step("native", dtype, nan)
    py, _ = _step("python", dtype, nan)
    assert nat.nodes.tables.tensors.py == []  # type: ignore[attr-defined]  # every summary the kernel's
    permuted = [n.grad_inputs[0] for n in nat.nodes if n.name == "PermuteBackward0"]
    assert sorted(s.shape for s in permuted) == [(2, 3, 4, 5, 6), (2, 6, 4, 16), (8, 40, 30)]
    assert all(s.thumb is not None for s in permuted)
    assert sum(n.name == "SumBackward0" for n in nat.nodes) == 4  # each sends on an expanded gradient
    assert ops["aten::contiguous"] == 0 and ops["aten::clone"] == 0, ops  # no copy made to summarise them
    a, b = untimed(step_to_wire(nat)), untimed(step_to_wire(py))
    for d in (a, b):
        d["meta"].pop("recorder")
    for key in b:
        assert a[key] == b[key], f"the recorders differ in {key!r}"


def test_float64_strided_gradients_are_still_copied() -> None:
    """The kernel gathers float32, bfloat16 and float16; a float64 permuted gradient is copied first."""
    if not native.status()[0]:
        pytest.skip("no native recorder here")
    _, ops = _step("native", torch.float64, False)
    assert ops["aten::contiguous"] + ops["aten::clone"] > 0, ops
