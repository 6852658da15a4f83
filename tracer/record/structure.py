"""What a step's trace takes from the graph's structure alone (slot arguments, labels, schemas), and
the per-`Tracer` cache of it: a training loop builds the same graph every step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from gradscape.tracer import _compat
from gradscape.tracer.record.labels import ACCUMULATE, CHAIN_HOPS, THROUGH, Destinations, SlotInfo, schema_of, slot_args
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

    def __init__(self, size: int = 16) -> None:  # statics, edges, kinds and arrays of four graph structures
        self.size = size
        # a key → its statics list; keyed ("edges", ...), ("kinds", ...) or ("arrays", ...): a graph's edges, node
        # kinds or structure arrays (`NativeGraph.share_structure`)
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
    Also read while a backward is paused at a breakpoint (tracer/record/debug/breakpoints.py): the graph is
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


def compute_statics(infos: Sequence[SlotInfo], forward_class: Callable[[int], Any]) -> list[NodeStatics]:
    """`NodeStatics` of every node described by `infos` (in id order); `forward_class(i)`: the custom
    autograd.Function of node i (asked of "custom" nodes only), or None. A node's slot arguments and schema
    depend on its name, kind and slot count alone, but for custom and compiled nodes: those are made once
    per (name, kind, count) (a 100k-node step has a few dozen)."""
    made = _Statics(infos, forward_class)
    return [NodeStatics(*made.of(i)) for i in range(len(infos))]


class _Statics:
    """(args, labels, schema) of one node at a time (`of`), with what nodes share made once: the slot arguments
    by (name, kind, slot count), the schemas by name, each destination (`Destinations`)."""

    def __init__(self, infos: Sequence[SlotInfo], forward_class: Callable[[int], Any]) -> None:
        self.infos, self.forward_class = infos, forward_class
        self.where = Destinations(infos)
        self.args_of: dict[tuple[str, str, int], list[str]] = {}
        self.schemas: dict[str, str | None] = {}

    def of(self, i: int) -> tuple[list[str], list[str], str | None]:
        info = self.infos[i]
        name, kind = info.name, info.kind
        if kind == "custom" or kind == "compiled":
            child_params = [self.infos[c].param if c is not None else None for c in info.children]
            args = slot_args(name, kind, len(info.children), self.forward_class(i) if kind == "custom" else None,
                             child_params)
        else:
            key = (name, kind, len(info.children))
            args = self.args_of.get(key)  # type: ignore[assignment]
            if args is None:
                args = self.args_of[key] = slot_args(name, kind, len(info.children))
        labels = self.where.labels(info, args)
        if kind == "compiled" and info.module:
            labels = [lab.replace("graph input", f"compiled {info.module}: input") for lab in labels]
        schema = None
        if kind == "op":
            if name not in self.schemas:
                self.schemas[name] = schema_of(name)
            schema = self.schemas[name]
        return args, labels, schema


def grouped_statics(graph: ArrayGraph, forward_class: Callable[[int], Any]) -> list[NodeStatics]:
    """`compute_statics` of a graph held in arrays, each distinct node worked out once.

    NOTE [Grouped statics]
        A node's arguments, labels and schema depend on its name, kind and module, and on the destination
        of each slot: "no gradient needed", or its child's `child_key`, which is ("op", the child's module,
        its name) unless the child's chain of pass-through nodes (`THROUGH`, at most `CHAIN_HOPS`) ends at
        an AccumulateGrad node: then ("acc", the parameter, the leaf's shape, the hops). `_chains` follows
        the chains of all nodes at once, in numpy. Custom and compiled nodes also depend on the node itself
        (its Function, its children's parameters). So every other node is keyed by (name, kind, module,
        its slots' destination ids), and the first node of each key is worked out by the same code as
        `compute_statics`; the others share its lists. An unrolled loop of 100k nodes has a few dozen
        keys. tests/test_labels.py holds the two equal.
    """
    n = len(graph.name_codes)
    infos = _LazyInfos(graph)
    made = _Statics(infos, forward_class)
    dest = _destination_ids(graph)
    cid = graph.child_id
    slot_dest = np.where(cid >= 0, dest[np.maximum(cid, 0)], -1).astype(np.int32).tobytes()
    off = (graph.child_off * 4).tolist()
    codes, kinds, mods = graph.name_codes, graph.kinds, graph.modules
    groups: dict[tuple[Any, ...], tuple[list[str], list[str], str | None]] = {}
    out = []
    for i in range(n):
        kind = kinds[i]
        if kind == "custom" or kind == "compiled":  # their arguments come from the node itself
            out.append(NodeStatics(*made.of(i)))
            continue
        sig = (codes[i], kind, mods[i], slot_dest[off[i]:off[i + 1]])
        got = groups.get(sig)
        if got is None:
            got = groups[sig] = made.of(i)
        out.append(NodeStatics(*got))
    return out


class ArrayGraph(NamedTuple):
    """A walked graph as `grouped_statics` reads it: the name of each name code (`name_table`); per node (in id
    order) its name code, kind (as `NodeTrace.kind` says it) and module; parameters and leaf shapes by
    AccumulateGrad node; the slots' child ids (-1: None) in CSR form."""

    name_table: list[str]
    name_codes: list[int]
    kinds: list[str]
    modules: list[str | None]
    params: dict[int, str]
    acc_shapes: dict[int, tuple[int, ...]]
    child_off: np.ndarray
    child_id: np.ndarray


class _LazyInfos(Sequence[SlotInfo]):
    """The `SlotInfo` of a node of an `ArrayGraph`, made when asked for (most never are)."""

    def __init__(self, graph: ArrayGraph) -> None:
        self.g = graph
        self._made: dict[int, SlotInfo] = {}

    def __len__(self) -> int:
        return len(self.g.name_codes)

    def __getitem__(self, i: Any) -> Any:
        info = self._made.get(i)
        if info is None:
            g = self.g
            children = [None if c < 0 else c for c in g.child_id[g.child_off[i]:g.child_off[i + 1]].tolist()]
            info = self._made[i] = SlotInfo(g.name_table[g.name_codes[i]], g.kinds[i], g.modules[i], g.params.get(i),
                                            g.acc_shapes.get(i), children)
        return info


def _destination_ids(graph: ArrayGraph) -> np.ndarray:
    """Every node's destination key as a child (`labels.child_key`), as an id: equal keys, equal ids. The key
    is ("op", the node's module, its name) unless the node's chain of pass-through nodes ends at an
    AccumulateGrad node: the chains are followed for all nodes at once, as `child_key` follows one."""
    codes = np.asarray(graph.name_codes, np.int64)
    if not len(codes):
        return codes
    module_ids: dict[str | None, int] = {}
    mods = np.array([module_ids.setdefault(m, len(module_ids)) for m in graph.modules], np.int64)
    uniq, ids = np.unique(mods * (int(codes.max()) + 1) + codes, return_inverse=True)
    end, hops = _chains(graph, codes)
    acc = np.flatnonzero(end >= 0)
    if len(acc):
        rows, which = np.unique(np.column_stack([end[acc], hops[acc]]), axis=0, return_inverse=True)
        keyed: dict[tuple[object, ...], int] = {}
        row_ids = []
        for row in rows.tolist():
            words = tuple(dict.fromkeys(_HOP_WORDS[h] for h in row[1:] if h >= 0))  # each word once, in order
            key = ("acc", graph.params.get(row[0]), graph.acc_shapes.get(row[0]), words)
            row_ids.append(len(uniq) + keyed.setdefault(key, len(keyed)))
        ids[acc] = np.asarray(row_ids, np.int64)[which.reshape(-1)]
    return ids


_HOP_WORDS = sorted(set(THROUGH.values()))


def _chains(graph: ArrayGraph, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the AccumulateGrad node each node's pass-through chain ends at, else -1; the word of each hop, by
    `_HOP_WORDS` index, else -1): `child_key`'s walk, one step for every node at once."""
    n, top = len(codes), len(graph.name_table)
    word = np.full(top, -1, np.int64)  # name code → hop word (pass-through nodes)
    is_acc = np.zeros(top, bool)
    for code, name in enumerate(graph.name_table):
        if name in THROUGH:
            word[code] = _HOP_WORDS.index(THROUGH[name])
        is_acc[code] = name == ACCUMULATE
    off, cid = graph.child_off, graph.child_id
    one = np.flatnonzero(np.diff(off) == 1)
    only = np.full(n, -1, np.int64)  # the child of a node with one slot (-1: none, or more slots)
    only[one] = cid[off[one]]
    cur = np.arange(n)
    hops = np.full((n, CHAIN_HOPS), -1, np.int64)
    for step in range(CHAIN_HOPS):
        nxt = only[cur]
        go = (word[codes[cur]] >= 0) & (nxt >= 0)
        go[go] = (word[codes[nxt[go]]] >= 0) | is_acc[codes[nxt[go]]]
        if not go.any():
            break
        hops[go, step] = word[codes[cur[go]]]
        cur = np.where(go, nxt, cur)
    return np.where(is_acc[codes[cur]], cur, -1), hops
