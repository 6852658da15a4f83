"""The graph walk of one traced step: every node reachable from a backward's roots gets an id (its
position in `GraphWalk.records`, in visit order), its children and the senders of each of its inputs.
The walk only reads the graph; the node hooks are installed on what it found (tracer/record/node_hooks.py).

NOTE [Teardown]
    The walk holds a Python object for every node of the graph, and after the step those objects may
    be the graph's last owners (the loss is gone by then in most loops). The order they are let go in
    matters. Once Python has held a node, torch frees it through that object, and freeing it frees
    what it alone still holds, recursively in C: letting go of a node after the nodes it leads to made
    the release of a graph of 100k nodes (an LSTMCell loop unrolled over time) recurse once per node
    and crash the process on the default 8 MB C stack. So `release` drops the nodes in reverse creation
    order (a node's inputs are made before it, so this is a topological order: consumers first): each
    node freed still finds its inputs held here, and no chain of frees runs deeper than one node
    (bench/pernode.py --file 100000; tested in tests/test_scale.py). A graph the user still holds is
    freed later by the user's code, as torch frees it.
"""

from __future__ import annotations

from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer._model import NodeRun
from gradscape.tracer.record.labels import ACCUMULATE
from gradscape.tracer.record.model_index import ModelIndex

_sequence_nr = _compat.node_sequence_nr


def _kind_of(node: Any, name: str) -> str:
    """The kind of a node other than AccumulateGrad (the walk names those "param" or "leaf")."""
    if name == "CompiledFunctionBackward":
        return "compiled"
    if name == "CheckpointFunctionBackward":
        return "checkpoint"
    if name == "BackwardHookFunctionBackward":
        return "hook"
    if isinstance(node, torch.autograd.function.BackwardCFunction):
        return "custom"
    return "op"


# node class → (name(), kind) for classes whose nodes all share one name (checked: the name is the
# class's own), so a node's name costs a dict lookup rather than a new string from `name()`
_classes: dict[type, tuple[str, str]] = {}


class NodeRecord:
    """One node of the walked graph, while the step runs."""

    __slots__ = ("id", "node", "name", "kind", "seq", "param", "nexts", "children", "send", "sums", "runs")

    def __init__(self, id: int, node: Any, name: str, kind: str, seq: int, param: str | None,
                 nexts: tuple[tuple[Any, int], ...]) -> None:
        self.id, self.node, self.name, self.kind, self.seq, self.param = id, node, name, kind, seq, param
        self.nexts = nexts  # node.next_functions, read once (each read builds new tuples)
        self.children: list[tuple[int, int] | None] = []  # (child id, input_nr) per slot, set by the walk
        # per slot: the child input this node alone sends to, where the hook leaves its summary for
        # the child (NOTE [Dedupe]); None where another node sends there too
        self.send: list[tuple[int, int] | None] = []
        self.sums: dict[int, tuple[int, int]] | None = None  # slot → module sum it adds to (ModuleSums.plan)
        self.runs: list[NodeRun] = []  # the step's NodeRuns themselves, filled in by the hooks


class GraphWalk:
    """The nodes of one step's graphs, walked from the roots of each backward (`walk_from`)."""

    def __init__(self, model: ModelIndex) -> None:
        self.model = model
        self.records: list[NodeRecord] = []
        self.ids: dict[Any, int] = {}  # node → its id
        # (child id, input_nr) → the (node id, slot) pairs that send to it
        self.senders: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def walk_from(self, root: Any) -> int:
        """Iterative DFS from `root`; new nodes get ids in visit order. Returns root's id. Written out in
        one loop: it runs for every node."""
        ids, records, model = self.ids, self.records, self.model
        first_new = len(records)
        stack = [root]
        while stack:
            n = stack.pop()
            if n is None or n in ids:
                continue
            cls = type(n)
            known = _classes.get(cls)
            if known is None:
                name = n.name()
                kind = "acc" if name == ACCUMULATE else _kind_of(n, name)
                if name == cls.__name__ or name.endswith("::" + cls.__name__):
                    if len(_classes) > 4096:  # classes made on the fly (custom Functions defined per call)
                        _classes.clear()
                    _classes[cls] = (name, kind)
            else:
                name, kind = known
            nexts = n.next_functions  # each read builds new tuples: read once
            rid = len(records)
            if kind == "acc":
                param = model.param_of(n.variable)  # NOTE [Unsharded parameters] in model_index.py
                rec = NodeRecord(rid, n, name, "param" if param else "leaf", _sequence_nr(n), param, nexts)
            else:
                rec = NodeRecord(rid, n, name, kind, _sequence_nr(n), None, nexts)
            ids[n] = rid
            records.append(rec)
            for child, _ in reversed(nexts):
                if child is not None and child not in ids:
                    stack.append(child)
        self._link(first_new)  # children ids are known only once every node of the walk has an id
        return ids[root]

    def _link(self, first_new: int) -> None:
        """Children and senders of the nodes from `first_new` on (NOTE [Dedupe]: a child input with a
        single sender gets that sender's summary)."""
        ids, records, senders = self.ids, self.records, self.senders
        for rec in records[first_new:]:
            kids: list[tuple[int, int] | None] = []
            send: list[tuple[int, int] | None] = []
            rec.send = send  # before the loop: a node may send twice to one input (x * x)
            for j, (child, nr) in enumerate(rec.nexts):
                if child is None:
                    kids.append(None)
                    send.append(None)
                    continue
                slot = (ids[child], nr)
                kids.append(slot)
                prods = senders.get(slot)
                if prods is None:
                    senders[slot] = [(rec.id, j)]
                    send.append(slot)
                else:  # a second sender: the engine sums what they send, so nobody's summary is the child's
                    first, fj = prods[0]
                    records[first].send[fj] = None
                    prods.append((rec.id, j))
                    send.append(None)
            rec.children = kids

    # ---- what the module sums and the hidden-parameter watch ask of a graph (tracer/record/native.py's
    # `NativeGraph` answers the same)
    def id_of(self, node: Any) -> int | None:
        return self.ids.get(node)

    def seq_of(self, nid: int) -> int:
        return self.records[nid].seq

    def senders_of(self, child: int, nr: int) -> list[tuple[int, int]]:
        """The (node, slot) pairs that send to input `nr` of node `child`."""
        return self.senders.get((child, nr), [])

    def set_sum(self, nid: int, slot: int, key: tuple[int, int]) -> None:
        """That slot's gradients are added up into module sum `key` (`ModuleSums.add`, from the hook)."""
        rec = self.records[nid]
        if rec.sums is None:
            rec.sums = {}
        rec.sums[slot] = key

    def has_kinds(self, *kinds: str) -> bool:
        return any(r.kind in kinds for r in self.records)

    def new_since(self, first: int) -> tuple[int, bool]:
        """Of the nodes from `first` on: how many are not AccumulateGrad, and whether a parameter's is among them
        (NOTE [Repeated calls' thumbnails] in call_thumbs.py)."""
        kinds = [r.kind for r in self.records[first:]]
        return sum(1 for k in kinds if k not in ("param", "leaf")), "param" in kinds

    def release(self) -> None:
        """Let go of the graph's nodes (the step is over), consumers before what they consume
        (NOTE [Teardown])."""
        records = self.records
        self.records, self.ids, self.senders = [], {}, {}
        for rec in sorted(records, key=lambda r: r.seq, reverse=True):
            rec.node, rec.nexts = None, ()
