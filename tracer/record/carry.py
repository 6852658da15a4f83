"""A repeated forward's attribution, carried from one traced step to the next.

NOTE [Carried forwards]
    What a traced step learns in its forward is its attribution: the module of every node and its module
    calls, from the global module hooks (NOTE [Attribution by sequence window] in forward.py), and the
    user's line of every op, from the torch-function mode (NOTE [Source lines]). The mode costs a Python
    call per torch call of the forward (about 5 µs each in the actor-critic program of bench/, W7, whose
    forward makes ~500 torch calls: half of what tracing its step cost), and every module hook sends
    every module call through torch's slow path. A training loop makes the same forward every step, so
    this is work done once per forward shape.

    A step's forward is known by its `forward_key`: every walked node's name, kind and edges, its creation
    number counted from the step's start, the parameters and leaves. Two forwards with one key made the
    same nodes, in the same order, from the same parameters. A step with several backward calls
    (micro-batches of gradient accumulation, a GAN's passes, forward-forward's layer-local losses, an
    LBFGS closure) has a key per call: the graph's as that call began, walked as far as it then was (the
    call's own new nodes included), made of the nodes that call walked and the key of the call before it.

    `ForwardCarry` (one per Tracer) keeps the last forward recorded with the hooks
    and the mode: its calls' keys, every node's source line and module, and each call's module calls by
    node ids (`CallPlan`, tracer/record/module_sums.py). Once two such steps in a row had the same keys
    (`ready`), the Tracer's next steps run without the hooks and the mode (the wrapped backward calls
    hand the backward to the recorder, through the monitor's capture or, without the monitor, the traced
    step's own: NOTE [Patched backward] in tracer/record/patched_calls.py, NOTE [Backward handoff] in
    handoff.py).
    As each backward call starts, a carried step whose key for that call is the kept one takes the kept
    module calls (its module sums are planned from them), and at its end the kept lines and modules: what
    the hooks and the mode would have given, had the same code made the same nodes; each call's structure
    is checked as a single call's is. A carried step whose first call's key differs has no lines, modules
    or module calls, says so in `st.meta["notes"]`, and the next step runs with the hooks and the mode
    again; a later call whose key differs (or one more call than the kept step made) leaves the nodes the
    earlier calls walked attributed and its own nodes without, and says so too.

    Never carried: a step the Python recorder records (full tensors, an armed breakpoint); FSDP2 (its
    module hook names the unsharded parameters); after a step whose backward reached the recorder only
    through the mode (a backward function taken by name before the
    block opened, which the wrappers cannot see), or one with a compiled region (dynamo keeps a graph per
    function-mode stack: without the mode a traced step would run the graph compiled for untraced steps,
    which may differ, in donated buffers for one). A step whose problems include a parameter without a
    gradient resets the carry too: the reason names the line of the `.detach()` or `torch.no_grad()` that
    cut it, which only the mode sees, so while that lasts every step runs with the mode.

    What carrying cannot tell apart: two code paths that make the very same nodes from different lines or
    module calls (a branch whose two arms are the same ops; `self.fc(x)` in one step, `F.linear(x,
    self.fc.weight, self.fc.bias)` in the next). A carried step shows the kept step's lines and modules.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gradscape.tracer.record.native import KINDS

__all__ = ["NOT_CARRIED", "SECOND_PASS", "ForwardCarry", "attribution", "forward_key"]

_COMPILED = KINDS.index("compiled")

NOT_CARRIED = ("this step ran without the forward's hooks and function mode, to take its source lines, modules and "
               "module calls from the steps before it (NOTE [Carried forwards]), but its graph differed from "
               "theirs: its nodes have none of them; the next step records them")


SECOND_PASS = ("a backward call after the first, in a step that ran without the forward's hooks and function mode "
               "(NOTE [Carried forwards]), made a graph other than the one the kept step's same call made: the "
               "nodes it added have no source line, module or module call; the next step records them")


BREAKPOINT_NEXT_STEP = ("a breakpoint was set while this step's forward ran without the forward's hooks and function "
                        "mode (NOTE [Carried forwards]): the step is recorded as it began, and the breakpoint pauses "
                        "from the next step on")


def forward_key(g: Any, before: bytes) -> bytes:
    """The key of a backward call's forward (see the NOTE): `g`, the native recorder's graph as walked so far, whose
    last call's nodes, their creation numbers counted from the step's start, and the parameters and leaves among
    them are `g.structure` (NOTE [A backward call's ends in one call] in tracer/record/csrc/backward_call.h);
    `before`, the key of the step's call before it (b"" for the first). Each call hashes only the nodes it walked,
    chained to the key before it: a step of k backward calls hashes its graph once, not k times."""
    return hashlib.blake2b(before + g.structure, digest_size=16).digest()


class ForwardCarry:
    """The last forward recorded with the hooks and the mode, and whether the next step may go without."""

    __slots__ = ("keys", "sources", "modules", "plans", "marks", "fresh", "ready")
    keys: list[bytes]  # one per backward call of the kept step: its graph's key as that call began
    sources: list[str | None]
    modules: list[str | None]
    plans: list[list[Any]]  # per backward call: the module calls as far as the graph was walked then
    marks: list[list[tuple[int, int, tuple[int, int]]]]  # per backward call: the plans' `sum_marks`
    fresh: list[list[tuple[int, int, tuple[int, int]]]]  # per backward call: its marks the call before had not
    ready: bool

    def __init__(self) -> None:
        self.reset()

    def recorded(self, keys: list[bytes], sources: list[str | None], modules: list[str | None],
                 plans: list[list[Any]], marks: list[list[tuple[int, int, tuple[int, int]]]]) -> None:
        """A step recorded with the hooks and the mode: its backward calls' keys, every node's line and module,
        and each call's module calls and their marks."""
        self.ready = bool(keys) and keys == self.keys
        self.keys, self.sources, self.modules, self.plans, self.marks = keys, sources, modules, plans, marks
        # a call's marks extend the call before's when its module calls came after them (micro-batches): a
        # carried step sets only the new ones (`ModuleSums.use`), not every call's again (quadratic in the calls)
        self.fresh = [m[len(p):] if m[:len(p)] == p else m for p, m in zip([[], *marks[:-1]], marks)]

    def carried(self, key: bytes, index: int) -> tuple[list[Any], list[Any], list[Any]] | None:
        """A carried step's key as its backward call `index` starts: the kept module calls and marks of that
        call, and those of its marks the call before had not, when the key is the kept one (the calls before it
        matched theirs, or the carry would have been reset); else None, and the next step runs with the hooks
        and the mode."""
        if self.ready and index < len(self.keys) and key == self.keys[index]:
            return self.plans[index], self.marks[index], self.fresh[index]
        self.reset()
        return None

    def reset(self) -> None:
        """The next step runs with the hooks and the mode, and two such steps must agree again."""
        self.keys, self.sources, self.modules, self.plans, self.marks, self.ready = [], [], [], [], [], False
        self.fresh = []


def attribution(carry: ForwardCarry | None, g: Any, forward: Any, kept: tuple[list[Any], list[Any], int] | None,
                calls: tuple[list[Any], list[Any], list[Any]] | None) -> tuple[list[str | None], list[str | None]]:
    """Every node's module and source line for a natively recorded step (`g`, its graph): its forward's
    own (`forward`, the `ForwardRecorder`), or, for a carried step, the kept (modules, sources) `kept` for
    its first `kept[2]` nodes, those the backward calls whose keys matched the kept ones walked (the nodes
    of a call that did not match get None). A recorded step's are kept in `carry` with `calls`, its backward
    calls' keys, module calls and their module-sum marks (`ModuleSums.plans`, `.marks`, as each call began);
    None: not to be kept (see the NOTE for when)."""
    n = g.size
    if forward.carried:
        if kept is None:
            return [None] * n, [None] * n
        mods, sources, upto = kept
        if upto == n == len(mods):  # the steps share the kept lists (read them, do not mutate them)
            return mods, sources
        pad: list[str | None] = [None] * max(0, n - upto)
        return (mods[:upto] + pad)[:n], (sources[:upto] + pad)[:n]
    mods, sources = forward.modules_of(g.seq.tolist()), forward.sources_of(g.seq)
    if carry is not None and forward.recorded:
        if calls is not None and not bool((g.kind == _COMPILED).any()):
            keys, plans, marks = calls
            carry.recorded(keys, sources, mods, plans, marks)
        else:
            carry.reset()
    return mods, sources
