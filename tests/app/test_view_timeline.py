"""The timeline's figure (app/view/timeline.py): trigger labels in rows that do not overlap, and room kept for
them above the plot."""

from __future__ import annotations

import math

from gradscape.app.view.timeline import LABEL_ROWS, timeline_figure

PLOTLY_MIN_PLOT_PX = 64  # below this plotly shrinks every margin, the labels' one included
LEGEND_WRAPPED_PX = 50  # the bottom margin plotly grows to for a legend wrapped onto two lines


def _rows(n: int, triggers: dict[int, str]) -> list[dict]:
    return [{"step": s, "loss": 1.0 + s * 0.01 if s not in triggers or triggers[s] != "nonfinite" else math.nan,
             "grad_norm": 1.0, "traced": s in triggers, "trigger": triggers.get(s)} for s in range(n)]


def test_two_close_triggers_take_two_label_rows_and_the_plot_keeps_its_minimum_height() -> None:
    fig = timeline_figure(_rows(160, {25: "loss_spike", 40: "nonfinite"}), "r")
    labels = fig["layout"]["annotations"]
    assert [a["text"] for a in labels] == ["loss_spike", "nonfinite"]
    assert labels[0]["yshift"] != labels[1]["yshift"]  # 15 steps apart on a 160-step axis: one above the other
    m = fig["layout"]["margin"]
    top_of_second_row = max(a["yshift"] for a in labels) + 13  # an 11 px font's box is 13 px tall
    assert m["t"] >= top_of_second_row
    assert fig["layout"]["height"] - m["t"] - LEGEND_WRAPPED_PX >= PLOTLY_MIN_PLOT_PX


def test_labels_with_no_room_in_the_rows_are_left_out_not_stacked_on_each_other() -> None:
    fig = timeline_figure(_rows(100, {k: "loss_spike" for k in range(40, 40 + 3 * LABEL_ROWS)}), "r")
    labels = fig["layout"]["annotations"]
    assert 1 <= len(labels) <= LABEL_ROWS
    assert len({a["yshift"] for a in labels}) == len(labels)
