"""What a step's trace takes from the graph's structure alone (slot arguments, labels, schemas), and
the per-`Tracer` cache of it: a training loop builds the same graph every step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gradscape.tracer import _compat
from gradscape.tracer.record.labels import ACCUMULATE, Destinations, SlotInfo, schema_of, slot_args
from gradscape.tracer.record.walk import NodeRecord


class NodeStatics:
    """What one node's trace takes from the graph's structure alone, shared by the steps that build
    the same graph; also the node's last shape lists, so an unchanged one is shared too."""

    __slots__ = ("args", "labels", "schema", "input_shapes", "output_shapes", "output_dtypes")

    def __init__(self, args: list[str], labels: list[str], schema: str | None) -> None:
        self.args, self.labels, self.schema = args, labels, schema
        self.input_shapes: list[Any] | None = None
        self.output_shapes: list[Any] | None = None
        self.output_dtypes: list[Any] | None = None


class StructureCache:
    """Per-`Tracer` memo of what a step's traces take from the graph's structure alone (slot
    arguments, labels, schemas), keyed by every node's type, name, kind, module, parameter and
    edges in walk order. A training loop builds the same graph every step, so this is computed
    once; the lists it holds are shared by the steps' `NodeTrace`s (read them, do not mutate them).
    Sharing also matters for speed beyond the labelling itself: every list a kept step owns is one
    more object for Python's cyclic garbage collector to re-scan.
    """

    def __init__(self, size: int = 12) -> None:  # statics, edges and kinds of four graph structures
        self.size = size
        # a key → its statics list; keyed ("edges", ...) or ("kinds", ...): a graph's edges or node kinds
        self._entries: dict[Any, Any] = {}

    def get(self, key: Any) -> Any:
        return self._entries.get(key)

    def put(self, key: Any, value: Any) -> Any:
        if len(self._entries) >= self.size:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = value
        return value


def slot_statics(records: list[NodeRecord], mods: list[str | None], cache: StructureCache) -> list[NodeStatics]:
    """Every walked node's slot arguments, labels and schema, from the `StructureCache` (computed
    and cached on a miss); `mods`: the nodes' modules (`ForwardRecorder.modules_of`), in walk order.
    Also read while a backward is paused at a breakpoint (tracer/debug/breakpoints.py): the graph is
    walked before the backward runs, so the labels are already those of the finished step."""
    key = tuple((type(r.node), r.name, r.kind, mod, r.param, tuple(r.children),
                 tuple(r.node.variable.shape) if r.kind == "leaf" else None)  # labels name a leaf's shape
                for r, mod in zip(records, mods))
    statics = cache.get(key)
    if statics is None:
        statics = cache.put(key, _compute(records, mods))
    return statics


def _compute(records: list[NodeRecord], mods: list[str | None]) -> list[NodeStatics]:
    """Slot arguments, labels and schema of every node: they depend only on the graph's structure
    (see `StructureCache`)."""
    infos = [SlotInfo(r.name, r.kind, mod, r.param, tuple(r.node.variable.shape) if r.name == ACCUMULATE else None,
                      [None if c is None else c[0] for c in r.children]) for r, mod in zip(records, mods)]
    return compute_statics(infos, lambda i: _compat.forward_class(records[i].node))


def compute_statics(infos: list[SlotInfo], forward_class: Callable[[int], Any]) -> list[NodeStatics]:
    """`NodeStatics` of every node described by `infos` (in id order); `forward_class(i)`: the custom
    autograd.Function of node i (asked of "custom" nodes only), or None. A node's slot arguments and schema
    depend on its name, kind and slot count alone, but for custom and compiled nodes: those are made once
    per (name, kind, count) (a 100k-node step has a few dozen)."""
    statics = []
    where = Destinations(infos)
    args_of: dict[tuple[str, str, int], list[str]] = {}
    schemas: dict[str, str | None] = {}
    for i, info in enumerate(infos):
        name, kind = info.name, info.kind
        if kind == "custom" or kind == "compiled":
            child_params = [infos[c].param if c is not None else None for c in info.children]
            args = slot_args(name, kind, len(info.children), forward_class(i) if kind == "custom" else None,
                             child_params)
        else:
            key = (name, kind, len(info.children))
            args = args_of.get(key)  # type: ignore[assignment]
            if args is None:
                args = args_of[key] = slot_args(name, kind, len(info.children))
        labels = where.labels(info, args)
        if kind == "compiled" and info.module:
            labels = [lab.replace("graph input", f"compiled {info.module}: input") for lab in labels]
        if kind == "op" and name not in schemas:
            schemas[name] = schema_of(name)
        statics.append(NodeStatics(args, labels, schemas[name] if kind == "op" else None))
    return statics
