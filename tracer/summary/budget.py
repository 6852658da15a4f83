"""The per-step thumbnail budget: past it, the thumbnails of the smallest-norm gradients are left out.

NOTE [Thumbnail budget]
    A step of a long unrolled loop has tens of thousands of gradients, and its thumbnails are most of
    its trace (`Tracer(thumb_budget=...)`). The budget counts thumbnail cells as the trace file keeps
    them, one byte each (NOTE [Compact thumbnails] in `tracer.wire.compact`). Gradients are taken by
    norm, largest first, and keep their thumbnails while the total fits; the others keep their
    statistics (always kept) and lose the thumbnail. `st.meta["thumbs_left_out"]` says so: the budget,
    how many were left out, and the largest norm among them, so that the page can tell a thumbnail
    left out by the budget from one never made.

    A recorded step keeps its gradient summaries in a table (NOTE [Step tables] in
    tracer/record/tables.py: `st.nodes.tables.tensors`, either recorder's); the budget reads that table's
    columns rather than making every node's `NodeTrace`, and walks only what is outside it (module sums,
    root gradients). Among gradients of equal norm at the cut, which keep their thumbnails may differ
    between the two recorders' steps (both orders are by norm; ties go by position in the table).

    The order and the cut exist once, here (`past_budget`): the step's end calls it over every gradient,
    and the native recorder calls it while the backward runs, to leave out pictures that can no longer
    fit (`past_budget_raw`; NOTE [Budget while recording] in tracer/record/csrc/budget.h).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from gradscape.tracer._model import StepTrace, TensorTrace

DEFAULT_BUDGET = 8 << 20  # bytes (8-bit cells) a step; a 940-node GPT step keeps ~6 MB of thumbnails


def _tensors(st: StepTrace, table: Any = None) -> list[TensorTrace]:
    """Every distinct tensor of the step that has a thumbnail, each once; with the step's `table`, only
    those outside it."""
    seen: dict[int, TensorTrace] = {}

    def add(ts: Iterable[TensorTrace | None] | None) -> None:
        for t in ts or ():
            if t is not None and t.thumb is not None:
                seen.setdefault(id(t), t)

    if table is None:
        for n in st.nodes:
            add(n.grad_inputs)
            add(n.grad_outputs)
            for r in n.runs:
                add(r.grad_inputs)
                add(r.grad_outputs)
    outside = getattr(st.modules, "outside_table", None)  # calls not made yet: their sums (NOTE [Lazy module calls])
    if table is not None and outside is not None:
        add(outside())
    else:
        for m in st.modules.values():
            for c in m.calls:
                add(c.grad_input)
                add(c.grad_output)
    add(st.params.values())
    for p in st.passes:
        add(p.root_grads)
    # (the table's after the rest is read: an entry made from one of its rows when read is the table's)
    skip = table.held() if table is not None else set()
    return [t for k, t in seen.items() if k not in skip]


def _norm(t: TensorTrace) -> float:
    return t.stats.get("norm", math.nan)


def _flagged(t: TensorTrace) -> bool:
    return t.stats.get("nan", 0) + t.stats.get("inf", 0) > 0


def raw_norms(raw: np.ndarray) -> np.ndarray:
    """The L2 norm of each row of raw statistics (min, max, sum, sum of squares, nonzero, nan, inf, n), as
    `stats["norm"]` gives it (NaN for a NaN)."""
    out = np.sqrt(np.maximum(raw[:, 3], 0.0))
    out[raw[:, 7] <= 0] = 0.0
    return out


def raw_flagged(raw: np.ndarray) -> np.ndarray:
    """Each row of raw statistics counted a NaN or an Inf."""
    return raw[:, 5] + raw[:, 6] > 0


def _keyed(norms: np.ndarray) -> np.ndarray:
    """Norms as the budget orders and reports them: a NaN as -1 (an infinite norm stays infinite)."""
    return np.where(np.isnan(norms), -1.0, norms)


def past_budget(cells: np.ndarray, norms: np.ndarray, flagged: np.ndarray, budget: int) -> np.ndarray:
    """The positions of the gradients whose thumbnails fall past `budget` cells, in the budget's order: flagged
    (NaN or Inf) first, then by norm, largest first (a NaN norm as -1), ties by position; the longest prefix
    whose cells fit keeps its thumbnails. Gradients without a thumbnail (0 cells) are never past it."""
    order = np.lexsort((-_keyed(norms), ~flagged))  # a stable sort: ties keep their position
    order = order[cells[order] > 0]
    fits = np.cumsum(cells[order]) <= budget
    cut = len(order) if fits.all() else int(np.argmin(fits))  # the first that does not fit, and all after it
    return order[cut:]


def past_budget_raw(raw: bytes, cells: bytes, budget: int) -> bytes:
    """`past_budget` of gradients given as buffers: raw statistics (8 float64 a gradient, `raw_norms`' order)
    and thumbnail cells (int64); the positions past it as int64. The native recorder calls it while it records
    (NOTE [Budget while recording] in tracer/record/csrc/budget.h), so that the budget's order exists once."""
    stats = np.frombuffer(raw, np.float64).reshape(-1, 8)
    return past_budget(np.frombuffer(cells, np.int64), raw_norms(stats), raw_flagged(stats),
                       budget).astype(np.int64).tobytes()


def apply_thumb_budget(st: StepTrace, budget: int | None, bound: int | None = None) -> int:
    """Leave out the thumbnails of the smallest-norm gradients past `budget` bytes (None: no limit).
    Returns how many were left out. A gradient with NaN or Inf is kept first: a debugger shows those.
    `bound`: the cells of every thumbnail the step's summariser made (`Summariser.thumb_cells`), an
    upper bound on what the step holds; within the budget, the step is not walked."""
    if budget is None or (bound is not None and bound <= budget):
        return 0
    tables = getattr(st.nodes, "tables", None)  # a natively recorded step (NOTE [Step tables])
    table = None if tables is None else tables.tensors
    extra = _tensors(st, table)
    cells = np.array([t.thumb.size for t in extra if t.thumb is not None], np.int64)
    norms = np.array([_norm(t) for t in extra], np.float64)
    flagged = np.array([_flagged(t) for t in extra], bool)
    rows = 0
    if table is not None:
        rows = len(table)
        cells = np.concatenate([table.thumb_cells(), cells])
        norms = np.concatenate([table.norms(), norms])
        flagged = np.concatenate([table.flagged(), flagged])
    if int(cells.sum()) <= budget:
        return 0
    dropped = past_budget(cells, norms, flagged, budget)
    if table is not None:
        table.drop_thumbs(dropped[dropped < rows])
    for k in dropped[dropped >= rows].tolist():
        extra[k - rows].thumb = None
    largest = float(_keyed(norms[dropped]).max()) if len(dropped) else -1.0
    st.meta["thumbs_left_out"] = {"budget": budget, "count": len(dropped), "max_norm": largest}
    return len(dropped)
