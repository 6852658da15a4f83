"""Triggers: the anomalies that get a step traced when no `every` scheduled it.

NOTE [Trigger rules]
    `nonfinite`   a backward root (the loss) is NaN or infinite. Known when the backward starts: that
                  very backward is traced (on a full step; on a light step the next step:
                  NOTE [Light steps] in light.py).
    `loss_spike`  the loss is far above its recent history: `loss - median > max(k * 1.4826 * MAD,
                  ratio * |median|)` over the last `window` finite losses of the same backward (first,
                  second, ... of the step), once `warmup` of them are known. With the defaults (k = 8,
                  ratio = 1) the loss must at least double and stand 8 robust standard deviations
                  above the median: step-to-step noise, a falling loss and a slow drift never fire it.
                  (The median is exact at every value; the MAD is computed for a loss already past
                  `ratio * |median|`, and with `ratio` = 0 recomputed every `REFRESH` = 4 values.)
                  Known when the backward starts: that very backward is traced (the next step, on a
                  light step).
    `grad_spike`  the total gradient norm (unscaled, before clipping) is far above its recent history,
                  by the same rule. Known when the step ends: the next step is traced.
    `amp_skipped` GradScaler skipped an optimizer step (inf/NaN gradients). Known when the step ends:
                  the next step is traced.
    Caps: at most `cap` triggered traces per Tracer (default 10), and after one, the same trigger
    stays quiet for `cooldown` steps (default 50), so a run that diverged is not traced at every step.
    A step `every` scheduled is traced anyway; a trigger there only adds its problem.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import sub
from typing import Any

from gradscape.tracer.summary.stats import median_sorted

TRIGGERS = ("nonfinite", "loss_spike", "grad_spike", "amp_skipped")
_MAD_SIGMA = 1.4826  # MAD → standard deviation of a normal distribution
REFRESH = 4  # with `ratio` 0, the MAD is recomputed after this many new values (it moves slowly)
BATCH_SORT = 8  # values of a batch (`SpikeRule.add_many`) from which the window is sorted again
QUIET_MAX = 1.7976931348623157e308  # the largest float: an infinite value is never under a bound
_SLACK = 1e-12  # a quiet bound's margin, of itself: under the rule's own rounding of `x - median`


@dataclass
class Triggers:
    """Which triggers are on and their thresholds (NOTE [Trigger rules]). `Tracer(triggers=...)` takes
    one of these, True (all, the default), False (none) or a list of trigger names.

    `kinds`: the triggers on (`nonfinite`, `loss_spike`, `grad_spike`, `amp_skipped`). A spike is
    `value - median > max(k · 1.4826 · MAD, ratio · |median|)` (`k`, `ratio`) over the last `window`
    finite values, after `warmup` of them; at most `cap` triggered traces per Tracer, and after one the
    same trigger stays quiet for `cooldown` steps."""

    kinds: tuple[str, ...] = TRIGGERS
    k: float = 8.0
    ratio: float = 1.0
    window: int = 100
    warmup: int = 20
    cap: int = 10
    cooldown: int = 50

    def __post_init__(self) -> None:
        self.kinds = tuple(self.kinds)
        bad = [t for t in self.kinds if t not in TRIGGERS]
        if bad:
            raise ValueError(f"triggers: unknown {bad}; choose from {list(TRIGGERS)}")
        for name in ("window", "warmup", "cap", "cooldown"):
            v = getattr(self, name)
            if type(v) is not int or v < 0:
                raise ValueError(f"triggers: {name} must be an int >= 0, got {v!r}")
        if not (self.k > 0 and self.ratio >= 0):
            raise ValueError(f"triggers: k must be > 0 and ratio >= 0, got k={self.k!r} ratio={self.ratio!r}")

    @classmethod
    def resolve(cls, v: Any) -> Triggers:
        """The `Triggers` that `Tracer(triggers=v)` means: `v` itself, all (True/None), none (False) or the
        names listed."""
        if isinstance(v, Triggers):
            return v
        if v is True or v is None:
            return cls()
        if v is False:
            return cls(kinds=())
        if isinstance(v, str):
            return cls(kinds=(v,))
        if isinstance(v, Iterable):
            return cls(kinds=tuple(v))
        raise TypeError(f"triggers must be True, False, a list of {list(TRIGGERS)} or a Triggers, "
                        f"got {type(v).__name__}")


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@dataclass
class SpikeRule:
    """`value - median > max(k·1.4826·MAD, ratio·|median|)` over a window of finite values.

    The window is kept in arrival order and sorted (`bisect`: an insertion and a removal a value, in C), so the
    median is exact at every value. The MAD is needed only for a value already past `ratio·|median|` (with the
    defaults, a loss that at least doubled: rare), or at every value when `ratio` is 0, where it is recomputed
    every `REFRESH` values."""

    window: int
    warmup: int
    k: float
    ratio: float
    values: deque[float] = field(default_factory=deque)
    ordered: list[float] = field(default_factory=list)  # `values`, sorted

    _mad: float | None = None  # the last MAD computed, for `ratio` 0
    _stale: int = 0  # values added since

    def __post_init__(self) -> None:
        self.values = deque(self.values, maxlen=self.window)  # (the oldest leaves as a value comes past `window`)

    def excess(self, x: float) -> tuple[float, float] | None:
        """(median, threshold) when `x` is a spike, else None."""
        s = self.ordered
        if not finite(x) or len(s) < max(self.warmup, 3):
            return None
        med = median_sorted(s)
        floor = self.ratio * abs(med)
        if x - med <= floor:
            return None  # within the ratio's bound: no MAD can make it a spike
        if self._mad is None or self._stale >= REFRESH or self.ratio > 0:
            # |v - med| of each, in C (no Python frame a value)
            self._mad = median_sorted(sorted(map(abs, map(med.__rsub__, s))))
            self._stale = 0
        limit = max(self.k * _MAD_SIGMA * self._mad, floor)
        return (med, med + limit) if x - med > limit else None

    def quiet_ladder(self, adds: int) -> tuple[float, tuple[float, ...]]:
        """`(pivot, ladder)`: while this rule takes its next `adds` values, of which `c` so far fell below `pivot`, no
        finite value at or below `ladder[c]` is a spike (NOTE [Quiet bound] in tracer/monitor/light_rows.py). An empty
        ladder: no bound can be given."""
        s = self.ordered
        n, need = len(s), max(self.warmup, 3)
        if n + adds <= need:  # (each of them meets fewer than `need` values)
            return QUIET_MAX, (QUIET_MAX,) * (adds + 1)
        if n < need:
            return QUIET_MAX, ()
        m, r = (n - 1) // 2, self.ratio
        lows = s[m - min(m, adds):m + 1]
        lows.reverse()  # (s[m - c] for c = 0, 1, ...)
        if lows[-1] >= 0:  # (the usual losses, none negative: `_least_floor` of each, in C-level passes)
            ys = list(map(min, map((1.0 + r).__mul__, lows), repeat(QUIET_MAX)))
            return s[m], tuple(map(sub, ys, map(_SLACK.__mul__, ys)))
        return s[m], tuple([_least_floor(v, r) for v in lows])

    def add(self, x: Any) -> None:
        if finite(x):
            self.add_finite(float(x))

    def take(self, x: float, check: bool = True) -> tuple[float, float] | None:
        """`excess(x)` (when `check`), then `add_finite(x)`, for `x` known to be a finite float: the one call a full
        step makes for each of its losses and its norm. `excess` is entered only past the ratio's bound (its first
        test, made here: the rare spike's MAD is its own)."""
        if check:
            s = self.ordered
            n = len(s)
            if n >= self.warmup and n >= 3:
                med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2  # (`median_sorted`)
                if x - med > self.ratio * abs(med):
                    hit = self.excess(x)
                    self.add_finite(x)
                    return hit
        self.add_finite(x)
        return None

    def add_many(self, vs: list[float]) -> None:
        """`add_finite` of each of `vs` (finite floats), in order: a batch past `BATCH_SORT` values re-sorts the
        window once, where one `insort` and one deletion a value cost a light batch's rows about 1 µs each."""
        if len(vs) < BATCH_SORT:
            for v in vs:
                self.add_finite(v)
            return
        values = self.values
        values.extend(vs)
        self.ordered = sorted(values)
        self._stale += len(vs)

    def add_finite(self, v: float) -> None:
        """`add` of a value known to be a finite float."""
        values = self.values
        old = values[0] if len(values) == self.window else None
        values.append(v)  # (`old` leaves)
        insort(self.ordered, v)
        self._stale += 1
        if old is not None:
            del self.ordered[bisect_left(self.ordered, old)]


def _least_floor(low: float, ratio: float) -> float:
    """The least `m + ratio * |m|` over every median `m >= low` (NOTE [Quiet bound] in tracer/monitor/light_rows.py)."""
    least = min(low * (1 + ratio), QUIET_MAX) if low >= 0 else (low * (1 - ratio) if ratio <= 1 else 0.0)
    return least - abs(least) * _SLACK


class TriggerState:
    """The triggers of one Tracer: the spike rules' windows, the cap and cooldowns, and a trigger
    waiting for the next step."""

    def __init__(self, cfg: Triggers) -> None:
        self.cfg = cfg
        self.loss_rules: dict[int, SpikeRule] = {}  # backward root position in the step → its rule
        self.grad_rule = self._rule()
        self.fired = 0
        self.last: dict[str, int] = {}  # trigger → step it last traced
        self.pending: tuple[str, int, dict[str, Any]] | None = None  # (trigger, step it was seen, details)

    def _rule(self) -> SpikeRule:
        c = self.cfg
        return SpikeRule(c.window, c.warmup, c.k, c.ratio)

    def on(self, kind: str) -> bool:
        return kind in self.cfg.kinds

    def allow(self, kind: str, step: int) -> bool:
        """The trigger is on and neither the cap nor its cooldown holds it back."""
        if kind not in self.cfg.kinds or self.fired >= self.cfg.cap:
            return False
        last = self.last.get(kind)
        return last is None or step - last > self.cfg.cooldown

    def fire(self, kind: str, step: int) -> None:
        self.fired += 1
        self.last[kind] = step

    def add_quiet(self, by_pos: list[list[float]]) -> None:
        """Losses (finite floats) known to set off no rule (NOTE [Quiet bound] in tracer/monitor/light_rows.py),
        by their place in their steps, each place's in step order, join their rules' windows."""
        rules = self.loss_rules
        for pos, vs in enumerate(by_pos):
            if vs:
                rules[pos].add_many(vs)

    def loss_trigger(self, losses: list[Any], first: int = 0) -> tuple[str, dict[str, Any]] | None:
        """The trigger a step's losses set off, if any (floats; `first`: the position in the step of the
        first of them, each position has its own window); then they join the windows. (Run on every backward:
        each loss is checked for finiteness once, and `excess` is asked only while nothing was found.)"""
        found: tuple[str, dict[str, Any]] | None = None
        rules = self.loss_rules
        for pos, v in enumerate(losses, first):
            if v is None:
                continue
            rule = rules.get(pos)
            if rule is None:
                rule = rules[pos] = self._rule()
            if not finite(v):
                if found is None and self.on("nonfinite"):
                    found = ("nonfinite", {"loss": v, "root": pos})
                continue  # (a rule's window holds finite values only)
            hit = rule.take(float(v), found is None)
            if hit is not None and self.on("loss_spike"):
                found = ("loss_spike", {"loss": v, "median": hit[0], "threshold": hit[1], "root": pos})
        return found
