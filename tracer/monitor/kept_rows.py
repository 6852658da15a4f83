"""The history rows the monitor keeps in memory and those not yet written, light steps' rows compact until read
(NOTE [Kept rows]).

NOTE [Kept rows]
    A batch of light rows (NOTE [Light rows] in light_rows.py) joins the history as one `LightBatch`: the steps,
    each row's number of losses, the losses in one list, each row's learning rates, and the blank row they are
    copies of (`rows.blank_row`, with the number of parameters of their time). A row becomes a dict
    (`rows.filled`) only when the history is read (`Monitor.history`), which keeps them for the next read, or
    written to a sink that takes it (`Monitor.flush`), whose dicts go with the batch written. So a batch stays
    compact in memory until the history is read, with a sink or without one.

    Why: the kept rows are most of what an always-on monitor holds in a long run, and as dicts each row was two
    objects more for the garbage collector's full collections to walk; a batch is a handful. The loop's steps
    are no faster for it: the dicts were a small part of a batch's cost (docs/costs.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import accumulate, islice
from typing import Any

from gradscape.tracer.monitor.rows import filled
from gradscape.tracer.wire.history import WireHistoryRow


class LightBatch:
    """Light rows as columns (NOTE [Kept rows]): `steps` and `nloss` (a row's losses) as sequences of ints, `losses`
    every row's losses in order, `lrs` each row's learning rates."""

    __slots__ = ("blank", "steps", "nloss", "losses", "lrs", "_wires")

    def __init__(self, blank: WireHistoryRow, steps: Sequence[int], nloss: Sequence[int], losses: list[Any],
                 lrs: list[Any]) -> None:
        if not len(steps) == len(nloss) == len(lrs) or sum(nloss) != len(losses):
            raise ValueError(f"a light batch of {len(steps)} steps, {len(nloss)} loss counts ({sum(nloss)} losses), "
                             f"{len(lrs)} rates and {len(losses)} losses")
        self.blank, self.steps, self.nloss, self.losses, self.lrs = blank, steps, nloss, losses, lrs
        self._wires: list[WireHistoryRow] | None = None

    def __len__(self) -> int:
        return len(self.steps)

    def wires(self, keep: bool = True) -> list[WireHistoryRow]:
        """The rows as history dicts: those made before, else made now (and kept for the next call when `keep`)."""
        if self._wires is not None:
            return self._wires
        cuts = list(accumulate(self.nloss, initial=0))
        out = [filled(self.blank, step, self.losses[cuts[i]:cuts[i + 1]], lr)
               for i, (step, lr) in enumerate(zip(self.steps, self.lrs))]
        if keep:
            self._wires = out
        return out

    def pop(self) -> WireHistoryRow:
        """The last row, as a dict, taken out of the batch."""
        n = len(self)
        nl = self.nloss[n - 1]
        at = len(self.losses) - nl
        row = filled(self.blank, self.steps[n - 1], self.losses[at:], self.lrs[n - 1])
        self.steps, self.nloss, self.lrs = self.steps[:-1], self.nloss[:-1], self.lrs[:-1]
        self.losses = self.losses[:at]
        if self._wires is not None:
            self._wires.pop()
        return row

    def tail(self, k: int) -> LightBatch:
        """The batch without its first `k` rows."""
        at = sum(islice(self.nloss, k))
        out = LightBatch(self.blank, self.steps[k:], self.nloss[k:], self.losses[at:], self.lrs[k:])
        if self._wires is not None:
            out._wires = self._wires[k:]
        return out


Entry = Any  # a history row (a dict), or a `LightBatch`


class KeptRows:
    """The last `keep` history rows (`rows`), and those not yet written to the sinks (`take_unsent`)."""

    __slots__ = ("keep", "kept", "n", "unsent", "n_unsent")

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.kept: deque[Entry] = deque()
        self.n = 0  # rows in `kept`
        self.unsent: list[Entry] = []
        self.n_unsent = 0

    def add(self, row: WireHistoryRow) -> None:
        self.kept.append(row)
        self.unsent.append(row)
        self.n += 1
        self.n_unsent += 1
        if self.n > self.keep:
            self._trim()

    def add_batches(self, batches: Iterable[LightBatch]) -> None:
        for b in batches:
            if len(b):
                self.kept.append(b)
                self.unsent.append(b)
                self.n += len(b)
                self.n_unsent += len(b)
        if self.n > self.keep:
            self._trim()

    def rows(self) -> list[WireHistoryRow]:
        """The rows kept, oldest first, as dicts."""
        return _wires(self.kept)

    def take_unsent(self) -> list[WireHistoryRow]:
        """The rows not yet written, as dicts (a batch's not kept in it); from now on they count as written."""
        out, self.unsent, self.n_unsent = _wires(self.unsent, keep=False), [], 0
        return out

    def drop_unsent(self) -> None:
        """The rows not yet written count as written (no sink takes them)."""
        self.unsent, self.n_unsent = [], 0

    def _trim(self) -> None:
        kept = self.kept
        while self.n > self.keep:
            first = kept[0]
            size = len(first) if type(first) is LightBatch else 1
            if self.n - size >= self.keep:
                kept.popleft()
                self.n -= size
            else:  # (part of a batch goes)
                kept[0] = first.tail(self.n - self.keep)
                self.n = self.keep


def _wires(entries: Iterable[Entry], keep: bool = True) -> list[WireHistoryRow]:
    out: list[WireHistoryRow] = []
    for e in entries:
        if type(e) is LightBatch:
            out += e.wires(keep)
        else:
            out.append(e)
    return out
