"""Source lines carried from one step to the next when the forward repeats itself.

NOTE [Carried source lines]
    The tracer's torch-function mode (NOTE [Source lines] in tracer/record/forward.py) finds the user's
    line of every op outside a library leaf, and the module of a direct forward call. It costs a Python
    call per torch call of the forward: about 5 µs each in the actor-critic program of bench/ (W7), whose
    forward makes ~500 torch calls, half of what tracing its step cost. A training loop makes the same
    forward every step, so the lines are work done once per forward shape.

    A step's forward is known by its `forward_key`: every walked node's name, kind, edges and creation
    number counted from the step's start, the parameters and leaves, and the module calls' sequence
    windows counted the same way (the module hooks record those with or without the mode). Two forwards
    with one key made the same nodes, in the same order, inside the same module calls.

    `SourceCarry` (one per Tracer with the monitor on) keeps the last key recorded with the mode, with
    the sources and modules it gave every node. Once two steps recorded with the mode in a row had the
    same key (`ready`), the Tracer's next steps run without the mode (the monitor's wrapped backward calls
    hand the backward to the recorder: NOTE [Patched backward] in tracer/record/patched_calls.py), and a
    natively recorded step whose key is the kept one takes its sources and modules from it: the same
    lists the mode would have given. A step whose key differs keeps what the module hooks give (modules,
    not lines outside library leaves), says so in `st.meta["notes"]`, and the next step runs with the mode
    again. Never carried: a step the Python recorder records (full tensors, an armed breakpoint); after
    a step whose backward reached the recorder only through the mode (a backward function taken by name
    before the block opened, which the wrappers cannot see); and a forward with a compiled region (dynamo
    keeps a graph per function-mode stack: without the mode a traced step would run the graph compiled
    for untraced steps, which may differ, in donated buffers for one).

    What the mode also gave and a carried step lacks: the problem finder's record of `.detach()` and
    `torch.no_grad()` calls, which it reads only to say why a parameter got no gradient (a `no_grad`
    problem). A step with such a problem resets the carry: while a parameter goes without a gradient
    every step runs with the mode, and a carried step that finds one (with the generic reason) is followed
    by steps with the mode, which say which line cut the graph.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from gradscape.tracer.record.native import KINDS

__all__ = ["NO_LINES", "SourceCarry", "attribution", "forward_key"]

_ACC_SEQ = (1 << 64) - 1  # an AccumulateGrad node's creation number
_COMPILED = KINDS.index("compiled")


def forward_key(g: Any, seq0: int, calls: list[Any]) -> tuple[Any, ...]:
    """The key of a step's forward (see the NOTE): `g`, the native recorder's graph; `seq0`, the creation
    counter when the step began; `calls`, the forward's `ModuleCallRecord`s."""
    seq = g.seq.astype(np.int64)  # AccumulateGrad's all-ones wraps to -1 and stays itself
    rel = np.where(g.seq == np.uint64(_ACC_SEQ), np.int64(-1), seq - np.int64(seq0))
    h = hashlib.blake2b(digest_size=16)
    for a in (g.name, g.kind, g.child_off, g.child_id, g.child_nr, rel):
        h.update(np.ascontiguousarray(a).tobytes())
    windows = tuple((c.name, c.lo - seq0, c.hi - seq0) for c in calls)
    return h.digest(), windows, tuple(sorted(g.params.items())), tuple(sorted(g.leaves.items()))


class SourceCarry:
    """The last forward recorded with the mode, and whether the next step may run without it."""

    __slots__ = ("key", "sources", "modules", "ready")

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.sources: list[str | None] = []
        self.modules: list[str | None] = []
        self.ready = False  # two steps in a row recorded with the mode had the same key

    def recorded(self, key: tuple[Any, ...], sources: list[str | None], modules: list[str | None]) -> None:
        """A step recorded with the mode: its key, sources and modules."""
        self.ready = key == self.key
        self.key, self.sources, self.modules = key, sources, modules

    def carried(self, key: tuple[Any, ...]) -> tuple[list[str | None], list[str | None]] | None:
        """A step recorded without the mode: the kept sources and modules when its key is the kept one;
        else None, and the next step runs with the mode."""
        if self.ready and key == self.key:
            return self.sources, self.modules
        self.reset()
        return None

    def reset(self) -> None:
        """The next step runs with the mode, and two such steps must agree before the carry resumes."""
        self.key, self.sources, self.modules, self.ready = None, [], [], False


NO_LINES = ("this step's forward differed from the steps before it, which it was to take its source lines from "
            "(NOTE [Carried source lines]): its ops outside library modules have no source line; the next step "
            "records them")


def attribution(carry: SourceCarry | None, g: Any, forward: Any, unwrapped: bool,
                notes: list[str]) -> tuple[list[str | None], list[str | None]]:
    """Every node's module and source line for a natively recorded step: from its own forward (`forward`,
    the `ForwardRecorder`), or carried (see the NOTE). `unwrapped`: a backward of the step reached the
    recorder only through the mode. A step that could not be carried adds `NO_LINES` to `notes`."""
    key = None if carry is None else forward_key(g, forward.seq0, forward.calls)
    if carry is not None and key is not None and not forward.with_mode:
        got = carry.carried(key)
        if got is not None:
            return got[1], got[0]
        notes.append(NO_LINES)
    mods, sources = forward.modules_of(g.seq.tolist()), forward.sources_of(g.seq)
    if carry is not None and key is not None and forward.with_mode:
        if unwrapped or bool((g.kind == _COMPILED).any()):
            carry.reset()
        else:
            carry.recorded(key, sources, mods)
    return mods, sources
