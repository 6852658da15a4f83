"""The rows of light steps, kept as they came until a batch of them joins the history (NOTE [Light rows]).

NOTE [Light rows]
    A light step (NOTE [Light steps] in light.py) on the CPU, with no row waiting before it, leaves its step,
    losses and learning rates here; they join the history as one batch (NOTE [Kept rows] in kept_rows.py) and
    pass the loss rules (NOTE [Trigger rules] in triggers.py) together (`Monitor.drain`): when `BATCH` are
    here, when `FLUSH_SECONDS` passed since the last batch, before any other step's row, and when history is
    read or written. A loss that a rule might find (not finite, or above its rule's quiet bound:
    NOTE [Quiet bound]) sends its batch at once, as its step ends, so a trigger it sets off traces the next
    step, as it did when every row joined at its step's end.
    The rules read every loss in step order either way, and the rows are the same rows; a batch's losses under
    their bounds only join their rules' windows (`TriggerState.add_quiet`). The learning rates are read from
    the parameter groups of the optimizers the monitor saw, as the last full step found them (`refresh`: a
    group added since is on the rows from the next full step on), or one optimizer at a time where a rate is
    not a float.

    Why: on the 3-20-30-2 MLP (bench W1) a light step's row and rules cost 3 µs in a loop of their own and
    10-11 µs inside the training loop, between its torch calls; kept, and made in a batch, 4-8 µs.

NOTE [Quiet bound]
    `SpikeRule.quiet_ladder(adds)`: a value x fires the loss-spike rule only if `x - median > ratio * |median|`
    (the rule's floor; with `ratio` 0, only if `x > median`), and only once `warmup` values (at least 3) are in
    its window. Take the n values held when a batch starts, sorted, m = (n - 1) // 2 and `pivot` the value at
    place m. While the next values arrive, c of them below `pivot`, the median cannot fall below `low`, the
    value at place m - c: at most m - c held values and c new ones lie below it, too few to fill the places
    0..m, a value dropped from the window moves none down, and the window never shrinks. So no x at or below
    `ladder[c]`, the least `m' + ratio * |m'|` over every median `m' >= low`, fires: `low * (1 + ratio)` for
    `low >= 0`, `low * (1 - ratio)` below 0 with `ratio <= 1`, else 0. A value that is not finite is never
    under a bound (`-inf < x <= bound`). Past the ladder's end (c > m), or while a batch would bring the window to its
    `warmup` values, there is no bound: every loss is read by the rules as its step ends (a batch that
    cannot reach `warmup` at all is under the bound whole: no rule reads a window that short).
    `tests/test_light_rows.py` checks the bound against the rule's definition, with values chosen to pull the
    median down as fast as it can go.
"""

from __future__ import annotations

from collections import deque
from statistics import median
from typing import Any

import torch

from gradscape.tracer.monitor.kept_rows import LightBatch
from gradscape.tracer.wire.history import WireHistoryRow

BATCH = 32  # light rows that join the history together (at most: NOTE [Light rows])
_NEG = float("-inf")


class LightRows:
    """The light rows not yet in the history, and each loss position's quiet bounds (NOTE [Quiet bound])."""

    __slots__ = ("rows", "loud", "pivots", "ladders", "below", "since", "spent", "per_row", "per_rows", "groups",
                 "layout", "opts", "native")

    def __init__(self) -> None:
        self.rows: list[tuple[int, list[Any], Any]] = []  # (step, losses, lr: a dict, or the rates read in `groups`)
        self.loud = False  # the last row's losses were not all under their bounds (the others' were)
        self.pivots: tuple[float, ...] = ()  # each loss position's, as its rule stood when the batch started
        self.ladders: tuple[tuple[float, ...], ...] = ()  # each loss position's bounds, by `below`
        self.below: list[int] = []  # each position's losses kept so far below its pivot
        self.since = 0.0  # `time.monotonic()` of the last batch
        self.spent = 0.0  # seconds the last batch took to join
        # what a light step's row costs (NOTE [Sampled norms]): the median of the recent batches' seconds a row (one
        # batch slowed by a collection of the garbage collector, or a flush, moves it little)
        self.per_row = 0.0
        self.per_rows: deque[float] = deque(maxlen=8)
        # the parameter groups of the optimizers seen, whose learning rates a light step reads (None: read them
        # by `learning_rates`, one is a tensor), each optimizer's name and number of groups; as `opts` optimizers
        # were seen and the last full step began (`refresh`)
        self.groups: list[dict[str, Any]] | None = []
        self.layout: list[tuple[str, int]] = []
        self.opts = 0
        # the native light step's block, which keeps its rows itself (NOTE [Native light steps] in light_native.py)
        self.native: Any = None

    def joined(self, seconds: float, n: int) -> None:
        """A batch of `n` rows joined the history in `seconds` (`spent`, `per_row`)."""
        self.spent = seconds
        if n:
            self.per_rows.append(seconds / n)
            self.per_row = median(self.per_rows)

    def waiting(self) -> bool:
        """Rows are kept that have not joined the history."""
        return bool(self.rows) or (self.native is not None and self.native.size() > 0)

    def refresh(self, optimizers: list[tuple[Any, str]]) -> None:
        """The parameter groups again, from the optimizers seen (rows kept before have joined: `Monitor.drain`)."""
        groups: list[dict[str, Any]] = []
        layout = []
        for ref, name in optimizers:
            opt = ref()
            if opt is not None:
                mine = [g for g in opt.param_groups if g.get("lr") is not None]
                layout.append((name, len(mine)))
                groups += mine
        floats = all(type(g["lr"]) is float for g in groups)  # (else a tensor, or an int: read each time)
        self.groups, self.layout, self.opts = groups if floats else None, layout, len(optimizers)
        self._push()

    def rates(self, raw: list[Any]) -> dict[str, list[float]]:
        """The row's `lr` from the learning rates a light step read (`raw`, in `groups`' order)."""
        lr, at = {}, 0
        for name, n in self.layout:
            mine = raw[at:at + n]
            lr[name] = mine if all(type(v) is float for v in mine) else _floats(mine)  # (a tensor set since)
            at += n
        return lr

    def add(self, step: int, losses: list[Any], lr: Any) -> bool:
        """Keep a light step's row; True when its batch should join the history now (`loud`: because of it)."""
        rows = self.rows
        rows.append((step, losses, lr))
        ladders, below = self.ladders, self.below
        for k, v in enumerate(losses):
            if v is None:
                continue
            if k >= len(ladders):
                self.loud = True  # (a position with no rule yet)
                return True
            c = below[k]
            ladder = ladders[k]
            if c >= len(ladder) or not _NEG < v <= ladder[c]:
                self.loud = True  # (a rule may fire: NOTE [Quiet bound])
                return True
            if v < self.pivots[k]:
                below[k] = c + 1
        return len(rows) >= BATCH

    def take(self, blank: WireHistoryRow) -> tuple[list[LightBatch], bool, list[float], list[list[float]]]:
        """The rows kept, as batches of rows copied from `blank` (NOTE [Kept rows] in kept_rows.py), in step order;
        whether the last was not under its bounds (`loud`); the native block's timed steps' costs (block seconds,
        own seconds, ...); and the losses of every row but a loud last one, by their place in the row (what the
        rules' windows take: `TriggerState.add_quiet`). The block's rows come first: it opens only with no row kept
        here (`Monitor.step`), and keeps its rows and lists itself, the same (NOTE [Native light steps] in
        light_native.py)."""
        batches: list[LightBatch] = []
        samples: list[float] = []
        by_pos: list[list[float]] = []
        loud = False
        if self.native is not None:
            steps, nloss, losses, lrs, loud, samples, by_pos = self.native.take(self.rates)
            if steps:
                batches.append(LightBatch(blank, memoryview(steps).cast("q"), memoryview(nloss).cast("q"), losses,
                                          lrs))
        rows, self.rows, loud_here, self.loud = self.rows, [], self.loud, False
        if rows:
            loud = loud_here
            batches.append(self._batch(blank, rows, by_pos))
        if loud and batches:  # (the last row's losses are read by the rules as that step's: `Monitor.drain`)
            last = batches[-1]
            for k, v in enumerate(last.losses[len(last.losses) - last.nloss[-1]:]):
                if v is not None:
                    by_pos[k].pop()
        return batches, loud, samples, by_pos

    def _batch(self, blank: WireHistoryRow, rows: list[tuple[int, list[Any], Any]],
               by_pos: list[list[float]]) -> LightBatch:
        """The rows kept in Python as a batch, their losses added to `by_pos`."""
        shared: tuple[Any, Any] = (None, None)  # (the raw rates, their `lr`): the same from step to step, mostly
        lrs, flat = [], []
        for _, losses, lr in rows:
            if type(lr) is not dict:
                if lr != shared[0]:
                    shared = (lr, self.rates(lr))
                lr = shared[1]
            lrs.append(lr)
            flat += losses
            for k, v in enumerate(losses):
                if v is not None:
                    while len(by_pos) <= k:
                        by_pos.append([])
                    by_pos[k].append(v)
        return LightBatch(blank, [r[0] for r in rows], [len(r[1]) for r in rows], flat, lrs)

    def bound(self, rules: dict[int, Any]) -> None:
        """Each position's bounds for the next batch, from the rules as they are now (positions from 0 on)."""
        pivots: list[float] = []
        ladders: list[tuple[float, ...]] = []
        while (rule := rules.get(len(pivots))) is not None:
            pivot, ladder = rule.quiet_ladder(BATCH)
            pivots.append(pivot)
            ladders.append(ladder)
        self.pivots, self.ladders, self.below = tuple(pivots), tuple(ladders), [0] * len(pivots)
        self._push()

    def _push(self) -> None:
        if self.native is not None:  # the block's bounds and groups as this object's
            self.native.bound(self.pivots, self.ladders, self.groups if self.groups is not None else [])


def learning_rates(optimizers: list[tuple[Any, str]]) -> dict[str, list[float]]:
    """Each optimizer's learning rates as they are now (one a parameter group; a tensor on a device is not read)."""
    lr: dict[str, list[float]] = {}
    for ref, name in optimizers:
        opt = ref()
        if opt is not None:
            lr[name] = _floats([g.get("lr") for g in opt.param_groups])
    return lr


def _floats(rates: list[Any]) -> list[float]:
    """Learning rates as floats: None and a tensor on a device left out (one is not read without a wait)."""
    return [float(v) for v in rates if v is not None and (not isinstance(v, torch.Tensor) or v.is_cpu)]
