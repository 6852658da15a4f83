"""Slot labels: name every `grad_inputs[j]` by the forward op's argument and say where it goes.

`grad_inputs[j]` is ∂L/∂(forward input j) and flows along `next_functions[j]` (docs/autograd.md).
The argument name comes from torch's derivatives table (`tracer.record.derivatives`); nodes that are not
in it (AccumulateGrad, CopySlices, custom Functions, compiled and checkpoint nodes) are named by
hand, and anything unknown falls back to `input j`, never an exception.

The destination follows the edge, through the pass-through nodes autograd puts between an op and a
parameter (`TBackward0` of `F.linear`'s weight, autocast's `ToCopyBackward0`, reshapes), so the
label of addmm's third slot reads `mat2 → fc2.weight (transposed)`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

from gradscape.tracer.record.derivatives import derivatives_table

ACCUMULATE = "torch::autograd::AccumulateGrad"

# Nodes that pass back zero wherever their unit was off: a dead unit passes back only zeros (debug/step_checks.py).
RELU_LIKE = frozenset({"ReluBackward0", "ThresholdBackward0", "HardtanhBackward0"})

# Nodes whose grad_inputs[0] holds exactly the elements of grad_outputs[0] in another shape.
VIEW_NODES = frozenset({
    "ViewBackward0", "TBackward0", "TransposeBackward0", "TransposeBackward1", "PermuteBackward0",
    "UnsqueezeBackward0", "UnsqueezeBackward1", "SqueezeBackward0", "SqueezeBackward1",
    "SqueezeBackward2", "UnsafeViewBackward0", "ReshapeAliasBackward0", "CloneBackward0",
    "AliasBackward0", "DetachBackward0",
})

# Pass-through nodes followed when describing where a slot's gradient ends up.
THROUGH = {
    "TBackward0": "transposed", "TransposeBackward0": "transposed", "PermuteBackward0": "permuted",
    "ToCopyBackward0": "cast", "ViewBackward0": "reshaped", "UnsafeViewBackward0": "reshaped",
    "ReshapeAliasBackward0": "reshaped", "ExpandBackward0": "broadcast, summed",
    "UnsqueezeBackward0": "reshaped", "SqueezeBackward0": "reshaped", "SqueezeBackward1": "reshaped",
}

CHAIN_HOPS = 4  # the longest chain of pass-through nodes `child_key` follows


@dataclass
class SlotInfo:
    """What the labeller needs to know about one node; filled by the tracer at walk time."""

    name: str
    kind: str
    module: str | None
    param: str | None
    leaf_shape: tuple[int, ...] | None
    children: list[int | None]  # node index per slot (None: the input needs no grad)


def schema_of(name: str) -> str | None:
    entry = derivatives_table().get(name)
    return None if entry is None else str(entry["schema"])


def slot_args(name: str, kind: str, n_slots: int, forward_cls: object | None = None,
              child_params: Sequence[str | None] = ()) -> list[str]:
    """Argument name of each of a node's `n_slots` input slots."""
    entry = derivatives_table().get(name)
    if entry is not None:
        args: list[str] = list(entry["args"])
        lists: list[bool] = list(entry["list"])
        if True in lists and len(args) != n_slots:
            i = lists.index(True)
            k = n_slots - (len(args) - 1)
            args = args[:i] + [f"{args[i]}[{m}]" for m in range(max(k, 0))] + args[i + 1:]
        if len(args) == n_slots:
            return args
    if name == "torch::autograd::CopySlices":
        base = ["self (base, before the in-place write)", "src (written values)"]
        return (base + [f"input {j}" for j in range(2, n_slots)])[:n_slots]
    if kind == "compiled":
        return [f"graph input {j}" + (f" ({p})" if p else "") for j, p in
                zip(range(n_slots), list(child_params) + [None] * n_slots)]
    if kind == "checkpoint":
        return [f"checkpointed fn arg {j}" for j in range(n_slots)]
    if kind == "custom" and forward_cls is not None:
        names = _forward_arg_names(forward_cls)
        if len(names) == n_slots:
            return names
    return [f"input {j}" for j in range(n_slots)]


def _forward_arg_names(cls: object) -> list[str]:
    fwd = getattr(cls, "forward", None)
    if fwd is None:
        return []
    try:
        params = list(inspect.signature(fwd).parameters.values())
    except (TypeError, ValueError):
        return []
    has_setup = "setup_context" in getattr(cls, "__dict__", {})
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names if has_setup else names[1:]


def destination(nodes: Sequence[SlotInfo], owner: SlotInfo, child: int | None) -> str:
    """Where the gradient in a slot of `owner` goes, in words."""
    return "no gradient needed" if child is None else _words(owner.module, child_key(nodes, child))


def child_key(nodes: Sequence[SlotInfo], child: int) -> tuple[object, ...]:
    """All `destination` reads of a slot's child: following a short chain of pass-through nodes towards a
    parameter, ("acc", its parameter, its leaf's shape, the hops) when it ends at one, else ("op", the child's
    module, its name)."""
    hops: list[str] = []
    c = nodes[child]
    for _ in range(CHAIN_HOPS):
        if c.name in THROUGH and len(c.children) == 1 and c.children[0] is not None:
            nxt = nodes[c.children[0]]
            if nxt.name in THROUGH or nxt.name == ACCUMULATE:
                if THROUGH[c.name] not in hops:
                    hops.append(THROUGH[c.name])
                c = nxt
                continue
        break
    if c.name == ACCUMULATE:
        return ("acc", c.param, c.leaf_shape, tuple(hops))
    direct = nodes[child]
    return ("op", direct.module, direct.name)


def _words(owner_module: str | None, key: tuple[object, ...]) -> str:
    """`destination` from the owner's module and the child's `child_key`."""
    if key[0] == "acc":
        _, param, leaf_shape, hops = key
        how = f" ({', '.join(hops)})" if hops else ""  # type: ignore[arg-type]
        if param:
            return f"{param}{how}"
        leaf = f"leaf tensor [{'×'.join(map(str, leaf_shape or ()))}]{how}"  # type: ignore[call-overload]
        return f"input of {owner_module} ({leaf})" if owner_module else leaf
    _, module, name = key
    if owner_module and module != owner_module and not _inside(module, owner_module):  # type: ignore[arg-type]
        return f"input of {owner_module}"
    if module and module != owner_module and not _inside(owner_module, module):  # type: ignore[arg-type]
        return f"output of {module} ({name})"
    return str(name)


class Destinations:
    """`destination` for every slot of one graph, each child's chain followed once and each (owner's module,
    child key) worded once: a 100k-node unrolled loop has a few dozen of those."""

    def __init__(self, nodes: Sequence[SlotInfo]) -> None:
        self.nodes = nodes
        self._keys: dict[int, tuple[object, ...]] = {}
        self._words: dict[tuple[str | None, tuple[object, ...]], str] = {}

    def labels(self, owner: SlotInfo, args: list[str]) -> list[str]:
        """Each slot's label of `owner`, "argument → destination" (one loop, no call a slot)."""
        keys, known, module = self._keys, self._words, owner.module
        out = []
        for a, child in zip(args, owner.children):
            if child is None:
                words = "no gradient needed"
            else:
                key = keys.get(child)
                if key is None:
                    key = keys[child] = child_key(self.nodes, child)
                words = known.get((module, key))  # type: ignore[assignment]
                if words is None:
                    words = known[(module, key)] = _words(module, key)
            out.append(f"{a} → {words}")
        return out


def _inside(inner: str | None, outer: str | None) -> bool:
    if inner is None or outer is None:
        return False
    return outer == "<root>" or inner.startswith(outer + ".")
