"""A module's calls: which of the step's nodes each forward call of a module made, and how a folded call
is labelled. A module called in a loop (an `nn.LSTMCell` over 10,000 time steps) opens into its calls
(`call_folds`), one folded node per call, rather than into every op of every call.

NOTE [Module calls]: the wire form keeps, for each call of a module, the nodes its outputs leave the graph
by (`calls[k]["out"]`) and its last op (`"last"`), not the list of its ops. A call's ops are found from
there: every node of the module (its submodules included) reached from the call's output nodes along the
backward edges (`[src, dst, slot]`: from the loss side towards the inputs) without passing another call's
output node. In a loop, call 17 reaches call 16 only through call 16's outputs (its `h` and `c`), so the
walk stops there. A node two calls reach (a parameter's AccumulateGrad: the same weight in every call) and
a node no call reaches belong to the module, not to a call, and are drawn in the module's box. The walk is
O(nodes + edges) of the module, once per step and module (`call_members` keeps the last few answers).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from gradscape.app.view.step_fields import Wire, inside, module_type, step_index

__all__ = ["CallMembers", "call_label", "call_members", "call_title", "calls_of", "more_label"]

SHARED = -1  # a node of the module two calls reach


@dataclass(frozen=True)
class CallMembers:
    """The nodes of one module by call: `calls[k]` the node ids call k + 1 made (in id order), `loose` the
    module's nodes of no single call."""

    calls: list[list[int]]
    loose: list[int]


_CACHE: OrderedDict[tuple[int, str], tuple[Wire, CallMembers]] = OrderedDict()
_CACHE_SIZE = 16


def calls_of(wire: Wire, module: str) -> int:
    """How many times `module`'s forward ran in the step (0 for a prefix that is no traced module)."""
    mod = wire["modules"].get(module)
    return len(mod["calls"]) if mod else 0


def call_members(wire: Wire, module: str) -> CallMembers:
    """The nodes each call of `module` made (NOTE [Module calls]); kept for the last few steps and modules
    asked (the wire object itself is kept with its answer, so an id is never reused for another step)."""
    key = (id(wire), module)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is wire:
        _CACHE.move_to_end(key)
        return hit[1]
    found = _walk(wire, module)
    _CACHE[key] = (wire, found)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return found


def _walk(wire: Wire, module: str) -> CallMembers:
    index = step_index(wire)
    in_module = [inside(m, module) for m in index.modules]
    code = index.module_code
    mine = [c >= 0 and in_module[c] for c in code]
    below: dict[int, list[int]] = {}
    for src, dst, _slot in wire["edges"]:
        if mine[src] and mine[dst]:
            below.setdefault(src, []).append(dst)
    owner = [0] * len(code)  # 0: no call yet; k: call k (from 1); SHARED
    mod = wire["modules"].get(module)
    seeds: list[list[int]] = []
    for k, call in enumerate(mod["calls"] if mod else [], 1):
        outs = [n for n in [*call["out"], call["last"]] if n is not None and 0 <= n < len(code) and mine[n]]
        fresh = [n for n in dict.fromkeys(outs) if owner[n] == 0]
        for n in fresh:
            owner[n] = k
        seeds.append(fresh)
    for k, start in enumerate(seeds, 1):
        stack = list(start)
        while stack:
            for nxt in below.get(stack.pop(), ()):
                if owner[nxt] == 0:
                    owner[nxt] = k
                    stack.append(nxt)
                elif owner[nxt] != k and owner[nxt] != SHARED and nxt not in seeds[owner[nxt] - 1]:
                    owner[nxt] = SHARED  # reached by two calls: the module's, drawn in its box
    calls: list[list[int]] = [[] for _ in seeds]
    loose: list[int] = []
    for n, k in enumerate(owner):
        if not mine[n]:
            continue
        if k > 0:
            calls[k - 1].append(n)
        else:
            loose.append(n)
    return CallMembers(calls, loose)


def call_title(wire: Wire, module: str, call: int) -> str:
    """`cell · call 17 of 300`: a folded call's first line, and an opened call's box label."""
    return f"{module} · call {call} of {calls_of(wire, module)}"


def call_label(wire: Wire, module: str, call: int, count: int) -> str:
    """A folded call's two-line label: `cell · call 17 of 300`, then its class and how many nodes it made."""
    kind = module_type(wire, module)
    return call_title(wire, module, call) + "\n" + (f"{kind} · " if kind else "") + f"{count} nodes"


def more_label(wire: Wire, module: str, shown: int, step: int) -> str:
    """The label of the calls not drawn yet: which they are, and what a click draws."""
    total = calls_of(wire, module)
    rest = total - shown
    return f"{module} · calls {shown + 1}–{total}\n{rest} more: click for {min(step, rest)} more"
