"""The per-step thumbnail budget: past it, the thumbnails of the smallest-norm gradients are left out.

NOTE [Thumbnail budget]
    A step of a long unrolled loop has tens of thousands of gradients, and its thumbnails are most of
    its trace (`Tracer(thumb_budget=...)`). The budget counts thumbnail cells as the trace file keeps
    them, one byte each (NOTE [Compact thumbnails] in `tracer.wire.compact`). Gradients are taken by
    norm, largest first, and keep their thumbnails while the total fits; the others keep their
    statistics (always kept) and lose the thumbnail. `st.meta["thumbs_left_out"]` says so: the budget,
    how many were left out, and the largest norm among them, so that the page can tell a thumbnail
    left out by the budget from one never made.
"""

from __future__ import annotations

import math

from gradscape.tracer._model import StepTrace, TensorTrace

DEFAULT_BUDGET = 8 << 20  # bytes (8-bit cells) a step; a 940-node GPT step keeps ~6 MB of thumbnails


def _tensors(st: StepTrace) -> list[TensorTrace]:
    """Every distinct tensor of the step that has a thumbnail, each once."""
    seen: dict[int, TensorTrace] = {}

    def add(ts: list[TensorTrace | None] | None) -> None:
        for t in ts or ():
            if t is not None and t.thumb is not None:
                seen.setdefault(id(t), t)

    for n in st.nodes:
        add(n.grad_inputs)
        add(n.grad_outputs)
        for r in n.runs:
            add(r.grad_inputs)
            add(r.grad_outputs)
    for m in st.modules.values():
        for c in m.calls:
            add(c.grad_input)
            add(c.grad_output)
    add(list(st.params.values()))
    for p in st.passes:
        add(p.root_grads)
    return list(seen.values())


def _norm(t: TensorTrace) -> float:
    v = t.stats.get("norm", math.nan)
    return -1.0 if math.isnan(v) else v


def apply_thumb_budget(st: StepTrace, budget: int | None, bound: int | None = None) -> int:
    """Leave out the thumbnails of the smallest-norm gradients past `budget` bytes (None: no limit).
    Returns how many were left out. A gradient with NaN or Inf is kept first: a debugger shows those.
    `bound`: the cells of every thumbnail the step's summariser made (`Summariser.thumb_cells`), an
    upper bound on what the step holds; within the budget, the step is not walked."""
    if budget is None or (bound is not None and bound <= budget):
        return 0
    tensors = _tensors(st)
    if sum(t.thumb.size for t in tensors if t.thumb is not None) <= budget:
        return 0
    tensors.sort(key=lambda t: (t.stats.get("nan", 0) + t.stats.get("inf", 0) > 0, _norm(t)), reverse=True)
    used, dropped, largest = 0, 0, -1.0
    for t in tensors:
        assert t.thumb is not None
        if not dropped and used + t.thumb.size <= budget:
            used += t.thumb.size
            continue
        t.thumb = None  # this one and every smaller one after it
        dropped += 1
        largest = max(largest, _norm(t))
    st.meta["thumbs_left_out"] = {"budget": budget, "count": dropped, "max_norm": largest}
    return dropped
