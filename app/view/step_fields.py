"""Small readers over a step's wire form (see `tracer.wire`), shared by the view modules.

The UI never rebuilds a `StepTrace`: the server's store hands out the step's wire form (without
arrays), typed by `tracer.wire`'s structures (`WireStep`, `WireNode`, `WireTensor`, ...), so mypy
checks every key read here and in the view against the schema's one definition. Node ids are
positions in `wire["nodes"]`; tensors are referred to by index into `wire["tensors"]`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from gradscape.tracer.wire import STAT_NAMES, WireNode, WireStep, WireTensor
from gradscape.tracer.wire.step_index import (  # noqa: F401 (ROOT_MODULE, param_owner: read from here by the view)
    ROOT_MODULE,
    StepIndex,
    drawn_module,
    index_from_wire,
    param_owner,
)

Wire = WireStep

ACCUMULATE = "torch::autograd::AccumulateGrad"
_STAT = {name: i for i, name in enumerate(STAT_NAMES)}
_BACKWARD_SUFFIX = re.compile(r"Backward\d*$")


def tensor(wire: Wire, index: int | None) -> WireTensor | None:
    """Tensor `index` of the step, or None for a missing slot (no gradient, or out of range)."""
    if index is None:
        return None
    tensors = wire["tensors"]
    return tensors[index] if 0 <= index < len(tensors) else None


def stat(t: WireTensor | None, name: str) -> float | None:
    """One statistic (`min max mean std norm nan inf zeros`) of a wire tensor; None when absent."""
    if t is None:
        return None
    stats = t["stats"]
    i = _STAT[name]
    return float(stats[i]) if i < len(stats) else None


def numel(shape: Sequence[int] | None) -> int:
    n = 1
    for s in shape or ():
        n *= int(s)
    return n


def max_abs(t: WireTensor | None) -> float | None:
    """max |g| = max(|min|, |max|) over the finite elements (NaN when the tensor has none)."""
    lo, hi = stat(t, "min"), stat(t, "max")
    if lo is None or hi is None:
        return None
    return max(abs(lo), abs(hi))


def zero_fraction(t: WireTensor | None) -> float | None:
    zeros = stat(t, "zeros")
    if t is None or zeros is None:
        return None
    n = numel(t["shape"])
    return zeros / n if n else None


def nonfinite(t: WireTensor | None) -> tuple[int, int]:
    """(NaN count, Inf count) of a wire tensor: a debugger shows these, never hides them."""
    nan, inf = stat(t, "nan"), stat(t, "inf")
    return int(nan or 0), int(inf or 0)


def fmt_shape(shape: Sequence[int] | None) -> str:
    """`[64×84]`; a 0-D tensor is `[scalar]`; unknown is `[?]`."""
    if shape is None:
        return "[?]"
    return "[" + "×".join(str(int(s)) for s in shape) + "]" if len(shape) else "[scalar]"


def fmt_num(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "nan"
    if v == 0 or (1e-3 <= abs(v) < 1e4):
        return f"{v:.4g}"
    return f"{v:.3e}"


def short_name(name: str) -> str:
    """`AddmmBackward0` → `Addmm`, `torch::autograd::CopySlices` → `CopySlices`: op names as drawn."""
    base = name.rsplit("::", 1)[-1]
    short = _BACKWARD_SUFFIX.sub("", base)
    return short or base


def node_module(node: WireNode) -> str | None:
    """The module a node is drawn inside, or None for the top level.

    AccumulateGrad nodes carry no module (they run outside any forward) but belong with the module
    that owns their parameter, so collapsing a layer also hides its parameters. Ops that ran in the
    model's own forward (`<root>`) are top level: a box around the whole model says nothing.
    """
    return drawn_module(node["module"], node["param"])


def step_index(wire: Wire) -> StepIndex:
    """What the view reads of every node (NOTE [Step index] in tracer/wire/step_index.py): the stored one of
    a step the page read (`TraceStore.read_indexed`), else made from the nodes, once per call (`indexed`
    keeps it, for a caller that reads it often)."""
    index = getattr(wire, "index", None)
    return index if index is not None else index_from_wire(wire)


@dataclass(frozen=True)
class NodeFields:
    """Per node, what the page reads of every node at once (the find box), as the node's map has it: its
    `names`, its own `modules`, `params` (node → the parameter it names) and `orders`, the order of its first
    run (-1: it never ran)."""

    names: list[str]
    modules: list[str | None]
    params: dict[int, str]
    orders: np.ndarray


def node_fields(wire: Wire) -> NodeFields:
    """Those fields: from a column document's arrays (`IndexedWire.columns`), no node's map made; else one
    pass over the maps (a step of an earlier release's file, or one built by hand)."""
    cols = getattr(wire, "columns", None)
    if cols is not None:
        names, modules, orders = cols.node_fields()
        return NodeFields(names, modules, dict(cols.params), orders)
    nodes = wire["nodes"]
    return NodeFields([n["name"] for n in nodes], [n["module"] for n in nodes],
                      {k: n["param"] for k, n in enumerate(nodes) if n["param"]},
                      np.array([-1 if n["order"] is None else n["order"] for n in nodes], np.int64))


def slot_labels(wire: Wire, k: int) -> list[str]:
    """Node `k`'s input slots' labels: from a column document's tables (no map made), else its map."""
    cols = getattr(wire, "columns", None)
    if cols is not None:
        return cast(list[str], cols.labels_of(k))
    return wire["nodes"][k].get("labels") or []


def module_type(wire: Wire, prefix: str) -> str | None:
    """The class name of module `prefix` (`Linear`), None for a prefix that is no traced module."""
    mod = wire["modules"].get(prefix)
    return mod["type"] if mod else None


@functools.lru_cache(maxsize=4096)
def prefixes(module: str | None) -> tuple[str, ...]:
    """`blocks.3.attn` → `("blocks", "blocks.3", "blocks.3.attn")` (outermost first); cached, since
    every node of a module asks for the same answer. The box of call 17 of `enc.cell` opened into its ops,
    `enc.cell#17` (`app.view.call_folds`), is inside the module's: `("enc", "enc.cell", "enc.cell#17")`."""
    if not module:
        return ()
    name, mark, _call = module.partition("#")
    parts = name.split(".")
    return tuple(".".join(parts[:k]) for k in range(1, len(parts) + 1)) + ((module,) if mark else ())


def parent_prefix(module: str) -> str | None:
    if "#" in module:  # an opened call's box: its module's
        return module.partition("#")[0]
    return module.rsplit(".", 1)[0] if "." in module else None


def inside(module: str | None, prefix: str) -> bool:
    """True when `module` is `prefix` or nested in it (`blocks.1` does not contain `blocks.10`)."""
    return module is not None and (module == prefix or module.startswith(prefix + "."))


def node_label(node: WireNode, wire: Wire) -> str:
    """What a node is called on the graph: the op's short name, or a parameter's name and shape."""
    if node["name"] == ACCUMULATE:
        shape = (node["out_shapes"] or [None])[0]
        if shape is None:
            go = node["go"] or [None]
            t = tensor(wire, go[0])
            shape = None if t is None else t["shape"]
        who = node["param"] or "leaf"
        return f"{who} {fmt_shape(shape)}"
    return short_name(node["name"])
