"""The text report (`gradscape show`, `StepTrace.summary()`) and the page's statistics table print a
fraction of zeros with the precision that tells it from 0% and from 100%."""

from __future__ import annotations

import math

import torch
from earlier_release import step_to_wire

import gradscape
from gradscape.app.view.heatmaps import stats_rows
from gradscape.tracer.report import percent


def test_percent_tells_a_small_fraction_from_zero_and_a_large_one_from_all() -> None:
    assert percent(0.0) == "0%" and percent(1.0) == "100%" and percent(0.5) == "50%"
    assert percent(0.0, 1) == "0%" and percent(1.0, 1) == "100%"
    assert percent(0.0004) == "0.04%"
    assert percent(1 / 3) == "33%" and percent(1 / 3, 1) == "33.3%"
    assert percent(0.99996) == "99.996%"
    assert percent(0.004, 1) == "0.4%" and percent(0.00004, 1) == "0.004%"
    assert percent(1e-12) == "1e-10%"
    assert percent(math.nan) == "—"


def test_a_gradient_with_one_zero_in_a_thousand_is_not_printed_as_zero_percent() -> None:
    x = torch.randn(1000, requires_grad=True)
    mask = torch.ones(1000)
    mask[7] = 0.0
    tr = gradscape.Tracer()
    with tr.step(0) as st:
        (x * mask).sum().backward()
    assert st is not None and int((x.grad == 0).sum()) == 1  # torch's own count
    text = st.summary()
    assert "zeros=0.1%" in text and "zeros=0%" not in text
    wire = step_to_wire(st)
    shown = [r["text"] for t in wire["tensors"] if t["shape"] == [1000]
             for r in stats_rows(t) if r["stat"] == "zeros%"]
    assert sorted(shown) == ["0%", "0.1%"]  # what arrived at the product (no zero), what it sent to x
