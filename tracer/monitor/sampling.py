"""Which steps the monitor takes its gradient norms on.

NOTE [Sampled norms]
    The monitor's fused norms (NOTE [Norms before and after clipping] in `capture.py`) cost a fixed few
    tens of µs a step: nothing against a 50 ms step, 15-30% of the regression program's (bench W6). The
    whole monitor may cost at most `BUDGET` (3%) of a step. A step that takes the norms is a full step (the
    forward snapshot of NOTE [Snapshots on the CPU only] in tracer/record/replay.py, the optimizer hooks,
    the clipped norms); one that does not is a light step (NOTE [Light steps] in `light.py`: its losses,
    GradScaler's skip). Both are timed (`NormClock`, `took`): on every full untraced step its whole cost
    (its norms and its own calls around the loop's: opening and closing the block, reading each loss, the
    hooks, the row, the snapshot), and on one step in `TIMED` (4), when light, its own (its row's share of
    the batch it joins with: NOTE [Light rows] in `light_rows.py`). The light steps' cost comes off `AIM` (2%)
    first, and the full steps get what it leaves, and never less than `FLOOR` (1%) of the step: they come every
    k-th step, k the smallest whole number for which their extra cost over k steps is within that room:
    k = ceil((full cost - light cost) / room), room = max(AIM × step - light cost, FLOOR × step), from
    the smallest full cost, the median step (the loop's own time: the block less the monitor's) and the
    median light cost of the recent steps (a step stalled by another process raises none of them), worked
    out again on each full step and every `KEEP` steps. A light step's row counts at the median of the recent
    batches' cost a row (`LightRows.joined` in light_rows.py: one batch slowed by a collection of the garbage
    collector once counted for every light step timed in it, and took k to 1). While k is 1, one step in
    `PROBE` (64) is light anyway, and timed: a light cost measured too high cannot keep every step full for
    good (a light step does less than a full one). Each light cost counts `UNSEEN` (2) times what the
    monitor's clock measured: measured on the loop, its code costs about twice its own time; a full step's counts
    `UNSEEN_FULL` (3) times: its code runs once in hundreds of steps on a small loop, colder still (monitors with
    and without norms, interleaved: a full step of the regression program, W6, cost the loop about 1 ms where
    its clock measured about 0.33 ms, and the 1% floor cost 1.4-1.6% on W1 and W6 at twice). (Until this
    release every step was full and only the norms were spread: a full step without norms of the 3-20-30-2
    MLP cost about 100 µs of its 0.26 ms.) `AIM` is a third under `BUDGET`, for what these estimates miss: on
    loops of several backward calls and optimizers (a GAN, forward-forward, a GCN) a monitor aimed at the budget
    itself cost more than it (docs/costs.md has the figures).
    The first `WARMUP` steps are full (what is measured), and so is every traced step (a trigger traces the
    step after the one that set it off: that one has its norms), and every step of a Tracer that has seen
    a GradScaler (its skips read without a wait).
    What is checked on every step, full or light: the losses (a non-finite one, a loss spike) and
    GradScaler's skip (its `found_inf`; on a full step the norms are then taken, to name the parameters that
    held inf/NaN). Each history row says whether it has norms (`norms`); `grad_norm`, `param_norms` and
    `grad_norm_clipped` are None on the others, and the grad-spike rule looks only at rows with norms.
    On the steps that have them the norms are the same computation as before: `grad_norm_before_clip`
    stays equal to what `clip_grad_norm_` returned. `Tracer(norms_every=k)` fixes k (1: every step full).
"""

from __future__ import annotations

import math
import time
from collections import deque
from statistics import median

BUDGET = 0.03  # of a step's time, the most the monitor may cost on average, its norms included
AIM = 0.02  # of a step's time, what `k` is chosen for: under `BUDGET`, by what the estimates miss (the NOTE)
FLOOR = 0.01  # of a step's time, what the norms may always cost on average, whatever the rest costs
WARMUP = 8  # first steps that always take the norms (and are measured)
KEEP = 8  # norm steps whose costs are remembered
K_MAX = 1000
# what the monitor's code costs the loop, over what its own clock measures of it: its code runs colder between the
# loop's calls and slows theirs (a light step of the 3-20-30-2 MLP measured 19-22 µs and cost the loop 40-45 µs; at
# k = 3 the actor-critic program's measured 3% cost it 4-8% in six runs)
UNSEEN = 2.0
UNSEEN_FULL = 3.0  # the same for a full step's cost: its code runs colder (the NOTE)
TIMED = 4  # a light step in this many is timed for the sampler (the light steps' costs barely move)
PROBE = 64  # while every step takes the norms (k 1, chosen), one step in this many is light, and timed


class NormClock:
    """Seconds spent in one step's norm calls (`with clock:` around each)."""

    __slots__ = ("spent", "_t0")

    def __init__(self) -> None:
        self.spent = 0.0
        self._t0 = 0.0

    def __enter__(self) -> NormClock:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.spent += time.perf_counter() - self._t0


class NormSampler:
    """`due(traced)`: whether this step takes the norms; `took(norm_s, step_s, own_s)` after each untraced step."""

    def __init__(self, every: int | None = None) -> None:
        if every is not None and (type(every) is not int or every < 1):
            raise ValueError(f"norms_every must be a positive int or None (chosen from the measured cost), "
                             f"got {every!r}")
        self.fixed = every
        self.k = every or 1
        self.steps = 0  # steps seen
        self.since = 0  # steps since the last that took the norms
        self.costs: deque[float] = deque(maxlen=KEEP)  # the whole monitor's time on the recent full steps
        self.times: deque[float] = deque(maxlen=KEEP)  # the loop's own time on the recent steps
        self.owns: deque[float] = deque(maxlen=KEEP)  # the monitor's time on the recent light steps
        self.seen = 0  # untraced steps timed

    def due(self, traced: bool) -> bool:
        self.steps += 1
        warm = self.fixed is None and self.steps <= WARMUP
        probe = self.k == 1 and self.fixed is None and self.steps % PROBE == 0  # (a light step's cost measured again)
        take = traced or warm or (self.since + 1 >= self.k and not probe)
        self.since = 0 if take else self.since + 1
        return take

    def light_run(self) -> int:
        """How many of the next steps `due` makes light, none of them traced (0 while it warms up or may probe)."""
        if self.fixed is None and (self.steps < WARMUP or self.k == 1):
            return 0
        return max(0, self.k - 1 - self.since)

    def skip(self, n: int) -> None:
        """`n` light steps taken without `due` (within `light_run`: NOTE [Native light steps] in light_native.py)."""
        self.steps += n
        self.since += n

    def took(self, norm_s: float | None, step_s: float, own_s: float = 0.0) -> None:
        """An untraced step: `norm_s` in its norm calls (None: it took none), `step_s` its block's whole time,
        `own_s` the monitor's own time in and around the block, the norms aside."""
        if self.fixed is not None or not self._note(norm_s, step_s, own_s):
            return
        # k again on a step with norms and every `KEEP` steps (the medians move slowly; three a step were a
        # tenth of the monitor's own time on a 1 ms step)
        if self.costs and (norm_s is not None or self.seen % KEEP == 0):
            self._choose()

    def took_light(self, samples: list[float], extra: float) -> None:
        """The native block's timed light steps (NOTE [Native light steps] in light_native.py): `samples` holds
        (block seconds, own seconds) of each, to both of which `extra` (its row's share of its batch) adds; k again
        once, after them. Only the last `KEEP` can count (those before would leave the deques at once)."""
        if self.fixed is not None:
            return
        noted = False
        for k in range(max(0, len(samples) - 2 * KEEP), len(samples) - 1, 2):
            noted = self._note(None, samples[k] + extra, samples[k + 1] + extra) or noted
        if noted and self.costs:
            self._choose()

    def _note(self, norm_s: float | None, step_s: float, own_s: float) -> bool:
        loop_s = step_s - own_s - (norm_s or 0.0)
        if loop_s <= 0:
            return False
        if norm_s is not None:  # a full step's whole cost (NOTE [Light steps] in light.py)
            self.costs.append(UNSEEN_FULL * (norm_s + own_s))
        else:
            self.owns.append(UNSEEN * own_s)
        self.times.append(loop_s)
        self.seen += 1
        return True

    def _choose(self) -> None:
        step = median(self.times)
        light = median(self.owns) if self.owns else 0.0
        room = max(AIM * step - light, FLOOR * step, 1e-9)
        self.k = min(K_MAX, max(1, math.ceil((min(self.costs) - light) / room)))
