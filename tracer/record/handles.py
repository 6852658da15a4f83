"""The one owner of every hook a traced step installs.

Like torch's own multi-handle (`torch.utils.hooks`, where many hooks from one call come back as one
handle), `StepHandles` holds every handle of one step: the node hooks, the pre-hooks on parameters'
AccumulateGrad nodes, and the forward recorder's global module and optimizer hooks and function mode
(one `CallOnRemove`). `remove()` takes them all off, once, in the order they were added; it is what
leaving the `with` block does, and it is idempotent, so the step can call it before assembling and
again on the way out when something raised. See NOTE [Hook lifetime] in tracer/record/recorder.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Removable(Protocol):
    def remove(self) -> None: ...


class CallOnRemove:
    """A handle whose `remove()` calls `fn` once: for what a step installs that is not a single torch
    hook (the forward recorder's shared global hooks and its function mode)."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn: Callable[[], None] | None = fn

    def remove(self) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            fn()


class StepHandles:
    """Every handle of one traced step; `remove()` (or leaving `with`) removes them all. `add` is the
    list's own `append`, bound once: the walk adds one handle per node."""

    def __init__(self) -> None:
        self._handles: list[Removable] = []
        self.add: Callable[[Removable], None] = self._handles.append

    def __len__(self) -> int:
        return len(self._handles)

    def remove(self) -> None:
        """Remove every handle added so far. Idempotent; handles added later are kept for the next call."""
        handles, self._handles = self._handles, []
        self.add = self._handles.append
        for h in handles:
            h.remove()

    def __enter__(self) -> StepHandles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
