"""The problem finder: `StepTrace.problems`, what a person should look at first in a step.

docs/problems.md states what each kind means and the thresholds; this module follows it.

NOTE [Two moments]
    At the start of each backward (the graph is walked, saved tensors are still readable) the finder
    reads the value of each root: one scalar read per backward, the only work on a finite step there.
    Only when a root is NaN/Inf does it look further, at every walked node's saved tensors, to find
    where the first non-finite value of the forward was made (`ForwardSearch`, forward_search.py). At the end of the
    step it reads the gradient statistics the tracer computed anyway (the `nan`/`inf` counts) for the
    backward-born check, and the parameter gradients for the no-gradient, exploding, vanishing and
    dead checks.

The search for where a non-finite forward value was born is in forward_search.py (NOTE [Where a
non-finite forward value was born]); the checks on a finished step are in step_checks.py.
"""

from __future__ import annotations

import logging
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from gradscape.tracer._model import Problem, StepTrace, fill
from gradscape.tracer.record.debug.forward_search import ForwardSearch, nonfinite, value_word
from gradscape.tracer.record.debug.step_checks import (
    any_nonfinite_gradient,
    backward_born,
    dead,
    layer_norms,
    no_grad,
    op_name,
    where,
)
from gradscape.tracer.record.sources import user_frame
from gradscape.tracer.record.view import StepView
from gradscape.tracer.record.walk import NodeRecord

MAX_FORWARD = 5  # forward origins listed at most
MAX_DETACHES = 256  # detaches of a step remembered at most (each holds its graph until the step ends)
MAX_NO_GRAD_USES = 256  # leaf tensors needing grad that an op used under no_grad, remembered at most per step

log = logging.getLogger(__name__)

# A layer's norm history lives as long as its Tracer: keyed by the per-Tracer `StructureCache` every
# step recorder of that Tracer is given (a weak key, so it goes with the Tracer)
_histories: weakref.WeakKeyDictionary[Any, dict[str, deque[float]]] = weakref.WeakKeyDictionary()

# Off: steps get no problems and the finder costs nothing (bench/overhead.py --finder compares both)
enabled = True


class StepProblems:
    """The finder's part of one step's recorder (NOTE [Two moments])."""

    def __init__(self, per_tracer: Any = None) -> None:
        self.history: dict[str, deque[float]] = {} if per_tracer is None else _histories.setdefault(per_tracer, {})
        self.bad_roots: list[tuple[int, int, str]] = []  # (pass index, root node id, "NaN" | "Inf")
        self.origins: list[dict[str, Any]] = []
        self.bad_forward: set[int] = set()  # node ids whose forward output held NaN/Inf
        self.detaches: list[tuple[Any, str | None]] = []  # (grad_fn of a detached tensor, line of the detach)
        # leaf tensors that need a gradient (parameters) used by an op under torch.no_grad(): the op's line
        self.no_grad_uses: dict[Any, str | None] = {}

    def note_detach(self, t: Any, frame: Any) -> None:
        """A `.detach()` in the step's forward, of a tensor with a graph: where a graph may have been cut."""
        fn = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
        if fn is not None and enabled and len(self.detaches) < MAX_DETACHES:
            self.detaches.append((fn, user_frame(frame)))

    def note_no_grad(self, args: tuple[Any, ...], frame: Any) -> None:
        """An op run under torch.no_grad() in the step: the parameters among its arguments, and its line (the
        first for each; a cut that explains a parameter without a gradient)."""
        uses = self.no_grad_uses
        if not enabled or len(uses) >= MAX_NO_GRAD_USES:
            return
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad and a.grad_fn is None and a not in uses:
                uses[a] = user_frame(frame)

    # ------------------------------------------------------------------ backward start
    def at_backward(self, recs: Callable[[], list[NodeRecord]], root_ids: list[int],
                    values: list[torch.Tensor | None], pass_index: int) -> None:
        """Read each root's value; look for the forward origin only when one is NaN/Inf (then `recs()` gives
        the walked nodes). Never raises."""
        if not enabled:
            return
        try:
            bad: dict[int, str] = {}
            for rid, t in zip(root_ids, values):
                if t is not None and nonfinite(t):
                    bad[rid] = value_word(t)
                    self.bad_roots.append((pass_index, rid, bad[rid]))
            if bad:
                search = ForwardSearch(recs(), bad)
                for o in search.origins():
                    if all(o != old for old in self.origins):
                        self.origins.append(o)
                self.bad_forward |= search.bad
        except Exception as exc:  # the finder must never break the user's backward
            log.warning("gradscape: the problem finder could not look at this backward's start: %s", exc)

    # ------------------------------------------------------------------ step end
    def finish(self, st: StepTrace, view: StepView, unmade: dict[str, tuple[float, bool]] | None = None,
               held: dict[str, tuple[float, bool]] | None = None) -> list[Problem]:
        """Every problem of the step, root cause first; sets `st.not_in_step` (the parameters without a
        gradient that are no problem, `step_checks.no_grad`). `unmade`: the parameters whose gradient is not in
        `st.params` yet, with its (norm, counted a NaN or an Inf) (`ParamGradients.unmade`); `held`: the same of
        those in it as rows of the step's tensor table, read without a `TensorTrace` made (`ParamGradients.held`).
        Never raises (the step is kept without them)."""
        if not enabled:
            return []
        try:
            return self._find(st, view, unmade or {}, held or {})
        except Exception as exc:
            log.warning("gradscape: the problem finder failed on step %s: %s", st.step, exc)
            return []

    def _find(self, st: StepTrace, view: StepView, unmade: dict[str, tuple[float, bool]],
              held: dict[str, tuple[float, bool]]) -> list[Problem]:
        out: list[Problem] = []
        nodes = st.nodes
        for o in self.origins[:MAX_FORWARD]:
            out.append(_forward_problem(st, o))
        for index, rid, word in self.bad_roots:
            n = nodes[rid]
            where = f" ({op_name(n.name)} at {n.source})" if n.source else f" ({n.name})"
            out.append(Problem("nonfinite_loss",
                               f"The loss{where}, where backward pass {index} started, is {word}"
                               + ("; every gradient is finite, so only the loss shows it." if
                                  not any_nonfinite_gradient(st) else "."), rid, None, n.source))
        if view.summ.nonfinite:  # a step whose every gradient is finite has no such node: not scanned
            out.extend(backward_born(st, self.bad_forward))
        missing, not_in_step = no_grad(st, view, self.detaches, self.no_grad_uses, unmade)
        fill(st, not_in_step=not_in_step)
        out.extend(missing)
        self.detaches, self.no_grad_uses = [], {}
        norms = {**unmade, **held} if held else unmade
        out.extend(layer_norms(st, view.model.module_params, self.history, norms, view.model.module_types))
        out.extend(dead(st))
        return out


def _forward_problem(st: StepTrace, o: dict[str, Any]) -> Problem:
    n = st.nodes[o["node"]]
    word = o["value"]
    if o["what"] in ("param", "leaf"):
        what = f"Parameter {n.param}" if n.param else "A leaf tensor of the graph"
        return Problem("nonfinite_forward", f"{what} already held {word} before this step's forward used it.",
                       n.id, n.param, None)
    if o["what"] == "input":
        return Problem("nonfinite_forward",
                       f"The input {o['arg']!r} of {op_name(n.name)}{where(n)} already held {word}: a tensor "
                       "from outside the graph (data, a buffer, or one computed without gradients).",
                       n.id, None, n.source)
    how = "made" if o["certain"] else "probably made"
    return Problem("nonfinite_forward",
                   f"The first {word} of the forward was {how} by {op_name(n.name)}{where(n)} from finite inputs.",
                   n.id, None, n.source)
