"""A natively recorded step's thumbnails gathered by shape (NOTE [Thumbnail stacks] in
tracer/record/thumb_stacks.py) are, byte for byte, what `TensorTable.thumb_of` gives row by row, and the trace
file keeps the same rows whether its pictures come one by one or stacked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_step_tables import _traced

from gradscape.tracer.record import native
from gradscape.tracer.record.thumb_stacks import thumb_stacks
from gradscape.tracer.wire.compact import ThumbTable

pytestmark = pytest.mark.skipif(not native.status()[0], reason="the arena holds a natively recorded step's thumbnails")


def _table(name: str, **opts: Any) -> Any:
    return _traced(name, **opts).nodes.tables.tensors


@pytest.mark.parametrize(("name", "opts"), [("transformer", {}), ("lstm", {}), ("cnn", {"thumb_budget": 300}),
                                            ("module_calls", {}), ("half", {})])
def test_the_stacks_hold_what_each_row_gives(name: str, opts: dict[str, Any]) -> None:
    tt = _table(name, **opts)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(tt))  # any order of the rows: positions are what the stacks name
    skip = rng.random(len(order)) < 0.2
    got: dict[int, np.ndarray] = {}
    for shape, (at, stack) in thumb_stacks(tt, order, skip).items():
        assert stack.shape[1:] == shape and np.all(np.diff(at) > 0)
        got.update((int(p), stack[i]) for i, p in enumerate(at))
    want = {p: th for p, k in enumerate(order.tolist()) if not skip[p] and (th := tt.thumb_of(k)) is not None}
    assert got.keys() == want.keys() and want
    for p, th in want.items():
        assert got[p].dtype == th.dtype and got[p].shape == th.shape and got[p].tobytes() == th.tobytes(), p
    if name == "cnn":
        assert tt.no_thumb.any()  # the budget left some out: they are in neither


def test_a_transposed_plans_pictures_are_stacked_as_the_rows_give_them() -> None:
    """A Linear's weight gradient reaches TBackward0 transposed: the kernel reads it through a transposed plan."""
    from gradscape.tracer.summary.fastpath import KERNEL_PLANS

    tt = _table("transformer")
    assert any(KERNEL_PLANS[p].transposed for p in tt.plan[tt.plan >= 0].tolist())


def test_the_file_keeps_the_same_rows_from_pictures_or_stacks() -> None:
    rng = np.random.default_rng(3)
    pool = [rng.standard_normal(s).astype(np.float32) for s in [(3, 5), (5, 3), (4, 4), (4, 4), (1, 6)]]
    pool += [np.ascontiguousarray(p.T) for p in pool[:3]]
    pictures: list[np.ndarray | None] = [None if k % 7 == 0 else pool[int(rng.integers(len(pool)))].copy()
                                         for k in range(300)]
    for k, empty in ((3, (0, 0)), (11, (0, 5)), (12, (4, 0))):  # a gradient with no element: an empty picture
        pictures[k] = np.zeros(empty, np.float32)
    want = ThumbTable().keep_arrays(pictures)
    moved = [k for k, p in enumerate(pictures) if p is not None and rng.random() < 0.6]
    stacked: dict[tuple[int, ...], Any] = {}
    for shape in {pictures[k].shape for k in moved}:  # type: ignore[union-attr]
        at = np.array([k for k in moved if pictures[k].shape == shape])  # type: ignore[union-attr]
        stacked[shape] = (at, np.stack([pictures[k] for k in at]))
    rest = [None if k in set(moved) else p for k, p in enumerate(pictures)]
    assert any(p is not None for p in rest) and stacked  # both ways, a shape in both among them
    assert ThumbTable().keep_arrays(rest, stacked) == want
    assert want[3] is None and want[11] is None and want[12] is None  # an empty picture keeps nothing
    assert sum(isinstance(c, dict) and "same" in c for c in want) > 50  # repeats across the two ways were found


def test_what_an_optimizer_stepped_with_is_stacked_from_its_float32_cells() -> None:
    """What each optimizer stepped with is summarised with float32 cells (at bfloat16's precision: NOTE [Arena
    thumbnails]); the node slots with bfloat16 cells: the stacks read each as its row does."""
    import torch

    import gradscape
    from gradscape.tracer.summary.fastpath import KERNEL_PLANS

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradscape.Tracer(model).step(0) as st:
        model(torch.randn(8, 6)).pow(2).sum().backward()
        opt.step()
    tt = st.nodes.tables.tensors
    wide = np.flatnonzero(tt.wide).tolist()
    # the four parameters' stepped gradients, and thumbnails of at most 16 cells (the loss's, the last bias's)
    cells = [np.prod(KERNEL_PLANS[p].th_shape or (0,)) for p in tt.plan.tolist()]
    assert len(wide) >= 4 and not tt.wide.all() and all(cells[k] <= 16 for k in range(len(tt)) if tt.wide[k]
                                                        and k not in wide[-4:])
    for name, p in model.named_parameters():
        want = p.grad.float().bfloat16().float().numpy().reshape(st.params[name].thumb.shape)
        assert np.array_equal(st.params[name].thumb, want), name
    order = np.arange(len(tt))
    got = {int(p): s[i] for _, (at, s) in thumb_stacks(tt, order, np.zeros(len(tt), bool)).items()
           for i, p in enumerate(at)}
    assert set(wide) <= got.keys()
    for k in got:
        th = tt.thumb_of(k)
        assert th is not None and got[k].tobytes() == th.tobytes(), k
