"""A natively recorded step's tables (NOTE [Step tables] in tracer/record/tables.py): the statistics read from
them, a parameter's node found without making the others, and the thumbnail budget's cut as written."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from earlier_release import step_to_wire
from test_native_recorder import PROGRAMS, _program
from zoo import loop_model, loop_step

import gradscape
from gradscape.tracer._model import STAT_NAMES
from gradscape.tracer.summary.stats import stats_from_raw
from gradscape.tracer.wire.column_write import step_columns


def _traced(name: str, **options: Any) -> Any:
    model, loss_of = _program(name)
    tr = gradscape.Tracer(model, **options)
    with tr.step(0) as st:
        loss_of(model).backward()
    assert st.meta.get("recorder") == "native", st.meta
    return st


def _made(st: Any) -> int:
    return sum(n is not None for n in st.nodes._made)


def test_the_thumbnail_budget_is_written_as_it_cut() -> None:
    """The pictures the budget left out of a natively recorded step are left out of its maps and its columns."""
    tr = gradscape.Tracer(loop_model(), thumb_budget=2_000)
    st = loop_step(tr, 0, 12)
    cut = st.meta["thumbs_left_out"]["count"]
    assert cut > 20
    assert sum(t["thumb"] is None for t in step_to_wire(st)["tensors"]) >= cut
    made = step_columns(st)
    assert made is not None
    assert sum(th is None for th, _ in made[1]) >= cut


def test_statistics_from_the_table_match_each_row_made_alone() -> None:
    """`TensorTable.stats_rows` against `stats_from_raw`, row by row, on rows with nothing finite, NaN and
    Inf counts, a single element and zero sums."""
    st = _traced("lstm")
    table = st.nodes.tables.tensors
    raw = np.array([[np.nan, np.nan, 0.0, 0.0, 0.0, 3.0, 1.0, 0.0],   # nothing finite
                    [2.0, 2.0, 2.0, 4.0, 1.0, 0.0, 0.0, 1.0],          # one element
                    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0],          # all zeros
                    [-1e300, 1e300, 1e300, np.inf, 4.0, 0.0, 2.0, 4.0],  # a sum of squares past float64
                    [-3.0, 5.0, 1.5, 40.0, 3.0, 1.0, 0.0, 3.0]])
    table.raw = np.concatenate([table.raw, raw])
    rows = table.stats_rows()
    for k in range(len(table.raw)):
        one = stats_from_raw(tuple(table.raw[k].tolist()))
        want = [float(one[s]) for s in STAT_NAMES]
        assert np.array(rows[k]).tobytes() == np.array(want).tobytes(), (k, rows[k], want)


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_parameters_node_is_found_without_making_the_others(name: str) -> None:
    """`StepTrace.param_node` reads the parameter column (the monitor asks it of a spiking layer every such
    step): the node the plain search over every node finds, and no other node made."""
    st = _traced(name)
    names = sorted({p for p in st.nodes.tables.params.values()})
    assert names, name
    got = {p: st.param_node(p) for p in names}
    assert _made(st) <= len(names)
    assert st.param_node("no.such.parameter") is None
    for p, node in got.items():
        assert node is not None and node is next(n for n in st.nodes if n.param == p), p
