"""The graph walk of one traced step: every node reachable from a backward's roots gets an id, its
children and its one hook (see `tracer._hooks`).
"""

from __future__ import annotations

from typing import Any

import torch

from gradscape.tracer._labels import ACCUMULATE
from gradscape.tracer._model import NodeRun
from gradscape.tracer._state import RecorderState


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


class _Rec:
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
        self.sums: dict[int, tuple[int, int]] | None = None  # slot → module sum it adds to (_plan_module_sums)
        self.runs: list[NodeRun] = []  # the step's NodeRuns themselves, filled in by the hooks


class WalkMixin(RecorderState):
    # ------------------------------------------------------------------ graph walk
    def _walk_from(self, root: Any) -> int:
        """Iterative DFS from `root`; new nodes get ids in visit order and their hook (see NOTE [One
        hook per node]). Returns root's id. Written out in one loop: it runs for every node."""
        ids, recs, handles, param_names = self.ids, self.recs, self._handles, self.param_names
        first_new = len(recs)
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
            rid = len(recs)
            if kind == "acc":
                var = n.variable
                param = param_names.get(var)
                if param is None and self.unsharded_names:  # NOTE [Unsharded parameters] in _recorder.py
                    param = self.unsharded_names.get(var)
                rec = _Rec(rid, n, name, "param" if param else "leaf", n._sequence_nr(), param, nexts)
                handles.append(n.register_prehook(self._make_acc(rec)))
            else:
                rec = _Rec(rid, n, name, kind, n._sequence_nr(), None, nexts)
                handles.append(n.register_hook(self._make_post(rec)))
            ids[n] = rid
            recs.append(rec)
            for child, _ in reversed(nexts):
                if child is not None and child not in ids:
                    stack.append(child)
        # children ids are known only once every node of the walk has an id
        producers = self._index
        for rec in recs[first_new:]:
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
                prods = producers.get(slot)
                if prods is None:
                    producers[slot] = [(rec.id, j)]
                    send.append(slot)
                else:  # a second sender: the engine sums what they send, so nobody's summary is the child's
                    first, fj = prods[0]
                    recs[first].send[fj] = None
                    prods.append((rec.id, j))
                    send.append(None)
            rec.children = kids
        return ids[root]

    def _watch_hidden_params(self) -> None:
        """A reentrant checkpoint (or a custom Function running its own backward) computes parameter
        gradients in a graph the walk cannot see. Holding the parameter's AccumulateGrad node makes
        that inner graph use it, so a pre-hook there still records the arriving gradient in
        `st.params` (the node itself is not part of the drawn graph)."""
        if not any(r.kind in ("checkpoint", "custom") for r in self.recs):
            return
        for p, name in self.param_names.items():
            if not p.requires_grad:
                continue
            node = torch.autograd.graph.get_gradient_edge(p).node
            if node in self.ids or node in self._hidden:
                continue
            self._hidden[node] = name
            self._handles.append(node.register_prehook(self._make_hidden_pre(name)))
