"""Which backward calls' gradient norms the step's next backward makes useless, learned from the step before.

NOTE [Superseded norms]
    The norms taken after a backward (NOTE [Norms before and after clipping] in capture.py) are read as each
    parameter's last snapshot (`stepped.before_map`). In a step of k micro-batches, the snapshot after
    each backward but the last is read by nothing: the next backward's snapshot covers the same parameters,
    whose `.grad` a backward only adds to. Knowing that needs the next backward's start, and the norms have
    to be taken before the loop's own code runs on: a gradient changed through `.data` between a backward
    and an optimizer step (the DQN tutorial clamps so) leaves no trace in its version counter, so norms
    taken later would be the changed ones.

    So each step learns, per backward call (counted from the block's opening), whether the next backward
    superseded its snapshot: every parameter in it still held the very same `.grad` tensor when the next
    backward (not `autograd.grad`, which leaves `.grad` alone) started. On the next step with norms, the
    snapshot after a call that was superseded last time is kept as its gradients, not taken; at the next
    backward's start it is dropped if superseded again, and taken then if not (the loop changed shape:
    `zero_grad` between the calls, say). Any other event before that (a clip, GradScaler's unscale, an
    optimizer's step, the block's end) takes it at once. A loop whose shape holds from step to step (a
    micro-batched step, a GAN's two passes of the discriminator) takes one snapshot per optimizer instead of
    one per backward. What this gives up: on a step whose shape differs from the step before's, a gradient
    changed through `.data` between a kept snapshot's backward and the event that takes it is read as
    changed (tests/test_superseded_norms.py checks the shapes that change through `zero_grad` and a clip).
"""

from __future__ import annotations

from operator import attrgetter, is_
from typing import Any

import torch

_GRAD = attrgetter("grad")

Grads = tuple[list[int], list[torch.Tensor]]


class Superseded:
    """One block's backward calls: which snapshots the next call superseded (`seen`, for the next step's
    block), and the latest snapshot's gradients, `kept` when its norms are not taken yet."""

    __slots__ = ("learned", "seen", "last", "kept")

    def __init__(self, learned: tuple[bool, ...]) -> None:
        self.learned = learned  # the step before's `seen`
        self.seen: list[bool] = []  # call k → its snapshot was superseded by call k + 1
        self.last: tuple[int, list[int], list[torch.Tensor]] | None = None  # the latest snapshot's call and gradients
        self.kept = False  # `last`'s norms are not taken yet

    def at_backward(self, k: int, api: str, params: list[Any]) -> Grads | None:
        """Backward call `k` starts: the gradients of a kept snapshot that it does not supersede (to take now),
        or None."""
        last, kept = self.last, self.kept
        self.last, self.kept = None, False
        if last is None:
            return None
        before, idx, grads = last
        # (each parameter's `.grad` still the one it left; `map`: no Python code a gradient)
        if before == k - 1 and api != "autograd.grad" and False not in map(is_, map(_GRAD, map(params.__getitem__,
                                                                                                idx)), grads):
            self.seen[before] = True
            return None
        return (idx, grads) if kept else None

    def after_backward(self, k: int, idx: list[int], grads: list[torch.Tensor]) -> bool:
        """Backward call `k` has left these gradients: True when they are kept, not taken (NOTE [Superseded
        norms])."""
        self.seen.extend([False] * (k + 1 - len(self.seen)))
        self.last = (k, idx, grads)
        self.kept = k < len(self.learned) and self.learned[k]
        return self.kept

    def take(self) -> Grads | None:
        """Something other than a backward is about to read or change the gradients: a kept snapshot's, to take
        now."""
        last, kept = self.last, self.kept
        self.last, self.kept = None, False
        return (last[1], last[2]) if last is not None and kept else None
