"""A kept step's arena is copied down to the pictures the thumbnail budget left in (NOTE [Arena compaction] in
tracer/record/arena_compact.py): every remaining picture reads as before, bit for bit, and the memory of the
pictures left out is given back."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
import torch
from test_budget_recording import _loop_step
from test_step_tables import _traced

import gradscape
from gradscape.tracer.record import native
from gradscape.tracer.record.arena_compact import _written
from gradscape.tracer.record.tensor_table import TensorTable, _plan_cells
from gradscape.tracer.record.thumb_stacks import thumb_stacks

pytestmark = pytest.mark.skipif(not native.status()[0], reason="the arena holds a natively recorded step's thumbnails")


def _arena_bytes(tt: Any) -> int:
    return sum(c.nbytes for c in tt.chunks)


def _pictures(tt: Any) -> list[bytes | None]:
    return [None if (th := tt.thumb_of(k)) is None else th.tobytes() + str(th.shape).encode() for k in range(len(tt))]


@pytest.mark.parametrize("name", ["transformer", "lstm", "cnn", "half"])
def test_pictures_left_in_read_as_before_and_the_rest_is_freed(name: str) -> None:
    tt = _traced(name).nodes.tables.tensors
    before = _pictures(tt)
    arena = _arena_bytes(tt)
    with_picture = np.array([p is not None for p in before])
    rng = np.random.default_rng(1)
    drop = np.flatnonzero(with_picture & (rng.random(len(tt)) < 0.7))
    tt.drop_thumbs(drop)
    after = _pictures(tt)
    assert _arena_bytes(tt) < 0.75 * arena, (arena, _arena_bytes(tt))
    for k in range(len(tt)):
        assert after[k] == (None if k in set(drop.tolist()) else before[k]), k
    order = rng.permutation(len(tt))
    stacks = thumb_stacks(tt, order, np.zeros(len(order), bool))
    got = {int(p): s[i].tobytes() + str(s[i].shape).encode() for _, (at, s) in stacks.items() for i, p in enumerate(at)}
    assert got == {p: after[k] for p, k in enumerate(order.tolist()) if after[k] is not None}


def test_a_small_cut_is_left_in_place() -> None:
    """Freeing under a quarter of the arena is not worth the copy: the table keeps its chunks."""
    tt = _traced("transformer").nodes.tables.tensors
    chunks = list(tt.chunks)
    has = np.flatnonzero([tt.thumb_of(k) is not None for k in range(len(tt))])
    tt.drop_thumbs(has[:1])
    assert all(a is b for a, b in zip(tt.chunks, chunks)) and len(tt.chunks) == len(chunks)


def test_a_block_views_share_counts_once() -> None:
    """Whether a cut frees a quarter of the arena is weighed against what the kernel wrote, each block once: a
    transformer's views share blocks (NOTE [Views share a buffer]), so counted once a row the arena looks larger,
    and a cut that frees less than a quarter of it would be copied."""
    tt = _traced("transformer").nodes.tables.tensors
    native = tt.plan >= 0
    cells = np.where(tt.evicted, 0, _plan_cells()[tt.plan])
    words = 8 + (cells * np.where(tt.wide != 0, 4, 2) + 7) // 8
    written, by_row = _written(tt, native, words), int(words[native].sum())
    assert written < 0.8 * by_row  # (the case this test is about)
    has = np.flatnonzero(native & (cells > 0)).tolist()
    drop: list[int] = []
    while int(words[sorted(set(has) - set(drop))].sum()) > 0.75 * by_row:
        drop.append(has[len(has) - 1 - len(drop)])
    assert int(words[sorted(set(has) - set(drop))].sum()) > 0.75 * written
    chunks = list(tt.chunks)
    before = _pictures(tt)
    tt.drop_thumbs(np.array(drop))
    assert all(a is b for a, b in zip(tt.chunks, chunks)) and len(tt.chunks) == len(chunks)
    assert [p for k, p in enumerate(_pictures(tt)) if k not in set(drop)] == \
        [p for k, p in enumerate(before) if k not in set(drop)]


def test_a_picture_read_before_the_cut_no_longer_holds_the_old_arena() -> None:
    """What an optimizer stepped with reads as a view of the arena's float32 cells; once the arena is copied the
    trace's picture is its own, with the same values, and what it shows equals the gradient's own rounding."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                torch.nn.Tanh(), torch.nn.Linear(64, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradscape.Tracer(model, thumb_budget=None).step(0) as st:
        model(torch.randn(32, 6)).pow(2).sum().backward()
        opt.step()
    tt = st.nodes.tables.tensors
    old = list(tt.chunks)
    shown = {name: st.params[name].thumb for name in st.params}
    assert any(any(np.shares_memory(th, c) for c in old) for th in shown.values())  # views, before
    wide = set(np.flatnonzero(tt.wide).tolist())
    drop = np.array([k for k in range(len(tt)) if k not in wide and tt.thumb_of(k) is not None])
    tt.drop_thumbs(drop)
    assert all(a is not b for a, b in zip(tt.chunks, old))
    for name, p in model.named_parameters():
        th = st.params[name].thumb
        assert not any(np.shares_memory(th, c) for c in old), name
        want = p.grad.float().bfloat16().float().numpy().reshape(th.shape)
        assert np.array_equal(th, want), name


def _loop(budget: int | None) -> Any:
    """A traced step of an LSTMCell loop (60 steps: about 1,000 nodes)."""
    return _loop_step(budget, steps=60)[0]


def test_a_budgeted_step_keeps_an_arena_the_size_of_its_budget() -> None:
    """A step over its budget (an LSTMCell loop) keeps about its budget's pictures in memory, not all of them."""
    run = _loop
    full = run(None).nodes.tables.tensors
    cut = run(20_000)
    tt = cut.nodes.tables.tensors
    assert cut.meta["thumbs_left_out"]["count"] > 0
    kept = int(tt.thumb_cells().sum())
    assert kept <= 20_000
    # each row left in: its 8 statistics and its cells in bfloat16 (a few float32, rounded up to whole doubles)
    assert _arena_bytes(tt) <= 8 * (8 * int((tt.thumb_cells() > 0).sum())) + 4 * kept + 8 * len(tt)
    assert _arena_bytes(tt) < _arena_bytes(full) / 4


def test_the_old_arena_is_freed_while_the_step_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget is applied as the step's block ends, while the step's native recorder still exists: that
    recorder has let go of the arena by then, so the copy frees the old chunks at once."""
    held: list[list[int]] = []
    drop = TensorTable.drop_thumbs

    def counted(self: TensorTable, ks: np.ndarray) -> None:
        bases = [c.base.obj for c in self.chunks]  # (the array's base is a memoryview of the bytearray)
        drop(self, ks)
        held.append([sys.getrefcount(b) - 3 for b in bases])  # beyond `bases`, `b` and getrefcount's argument

    monkeypatch.setattr(TensorTable, "drop_thumbs", counted)
    st = _loop(20_000)
    assert st.meta["thumbs_left_out"]["count"] > 0
    assert held == [[0] * len(held[0])] and held[0]
