"""The thumbnail size each backward call of a traced step summarises its gradients at.

NOTE [Repeated calls' thumbnails]
    A step of several backward calls often repeats one: gradient accumulation runs the same forward and
    backward on k micro-batches, a GAN's discriminator takes a real and a fake batch, forward-forward a
    positive and a negative one, an LBFGS closure runs again. A call repeats an earlier call of its step
    when it starts from roots of the same kinds (their grad_fn classes), walks as many new nodes other than
    AccumulateGrad, and reaches no parameter the step's calls had not reached (a parameter's AccumulateGrad
    is shared by every micro-batch's graph: walked once, by the first call that reaches it). So the second
    of forward-forward's two layers of one shape, trained one after the other, is no repeat of the first:
    its first call reaches new parameters. A repeated call's gradients get thumbnails of `Summariser.sizes[1]`
    cells a side (`Tracer(thumb=n)`: n / 2 rounded up; `thumb=(first, repeated)` sets both); every other
    call's, the first's included, get `sizes[0]`. Their statistics are the same either way: only the picture
    is coarser.

    Why: the thumbnail is most of the summary kernel's work on a transformer's gradients, and a step of
    k micro-batches pays it k times for pictures of k graphs of one shape. At half the side a picture has a
    quarter of the cells (a tiny GPT with 8 micro-batches: 1.34× → 1.27× of its plain step with every call
    at 32, measured in one process; docs/costs.md). A call that does not repeat one (a GAN's generator pass)
    keeps the full size.

    The parameters' gradients are summarised at the first size whenever they are summarised on their own
    (at an optimizer's step, at the step's end: `first_size`), so `st.params` does not depend on which call
    came last; a parameter whose `.grad` is the very tensor a repeated call delivered shares that arrival's
    picture. A module call's gradients are slots of its call's nodes, so a repeated call's module calls
    show its size; a module gradient summed over several ops is summarised at the step's end, at the first
    size. Both recorders take the size from here before a call's backward runs (the native one through
    `Recorder.set_thumb`), so they give the same pictures.
"""

from __future__ import annotations

from typing import Any

from gradscape.tracer.summary.summariser import Summariser


class CallThumbs:
    """Which of the summariser's two sizes each backward call of one step uses (see the NOTE)."""

    __slots__ = ("summ", "seen")

    def __init__(self, summ: Summariser) -> None:
        self.summ = summ
        self.seen: set[tuple[tuple[type, ...], int]] = set()  # (the roots' classes, new nodes) of the calls so far

    def at_call(self, roots: list[tuple[Any, int]], ops: int, new_params: bool, native: Any) -> None:
        """A backward call from `roots` (grad_fn, output nr) starts, whose walk found `ops` new nodes other than
        AccumulateGrad and, if `new_params`, parameters no call of the step reached before: its size."""
        shape = (tuple([type(node) for node, _ in roots]), ops)
        repeat = ops > 0 and not new_params and shape in self.seen
        self.seen.add(shape)
        self._use(self.summ.sizes[1] if repeat else self.summ.sizes[0], native)

    def first_size(self, native: Any) -> None:
        """Summaries made from now on at the first size, until the next backward call sets its own (`at_call`, before
        any of its hooks runs): no switch back after the summaries made here, which a call that is no repeat
        (forward-forward's next layer, a GAN's generator pass) would switch again at once."""
        self._use(self.summ.sizes[0], native)

    def _use(self, thumb: int, native: Any) -> None:
        if thumb != self.summ.thumb:
            self.summ.use_thumb(thumb)
            if native is not None:
                native.graph.rec.set_thumb(thumb)
