"""What the graph's elements show of every node, worked out once per step and colouring (`StepMarks`): the
colour range over the whole step, each node's statistic of the gradient that arrived at it, and its NaN/Inf
counts, with the legend drawn from that range.

These cover every node of the step, not only the drawn ones (colours keep their meaning when a module
opens), so recomputing them on each fold or first expand walked all nodes again: about a quarter of a
second of a first expand on a 10,000-node step. The page keeps one per (run, step, rank, colouring)
(`PageData.marks`), and `elements.cytoscape_elements` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gradscape.app.view.colours import check_color_by, colour_fields, legend, range_of
from gradscape.app.view.compiled import DIFF, diff_fields, diff_legend, diff_range, diff_values, worst_param
from gradscape.app.view.step_fields import Wire, step_index


@dataclass(frozen=True)
class StepMarks:
    color_by: str
    lo: float  # the colour range (log10 of the statistic, or a fraction for "zeros")
    hi: float
    values: list[float | None]  # per node id: the statistic of grad_outputs[0] (None: no gradient arrived)
    badges: list[tuple[int, int]]  # per node id: NaN and Inf counts over its grad_outputs and grad_inputs
    legend: dict[str, Any]  # `colours.legend` of the step
    flagged: bool = False  # some node has a badge
    worst: str | None = None  # `DIFF` only: the parameter with the largest difference (NOTE [Difference colouring])

    def fields(self, value: float | None) -> dict[str, Any]:
        """`value`, `color` and `value_text` of an element whose statistic is `value`."""
        if self.color_by == DIFF:
            return diff_fields(value, self.lo, self.hi)
        return colour_fields(value, self.color_by, self.lo, self.hi)


def step_marks(wire: Wire, color_by: str = "norm") -> StepMarks:
    """`color_by`: one of `COLOR_BY`, or `DIFF` (compiled − eager, for a step with `compare_compiled`)."""
    index = step_index(wire)  # the statistics and NaN/Inf counts of every node, without reading the nodes
    badges = [(0, 0)] * index.n_nodes
    for node, nan, inf in index.badges:
        badges[node] = (nan, inf)
    if color_by == DIFF:
        values = diff_values(wire)
        lo, hi = diff_range(values)
        return StepMarks(DIFF, lo, hi, values, badges, diff_legend(lo, hi), bool(index.badges), worst_param(wire))
    check_color_by(color_by)
    values = index.values[color_by]
    lo, hi = range_of(values, color_by)
    return StepMarks(color_by, lo, hi, values, badges, legend(wire, color_by, (lo, hi)), bool(index.badges))
