"""Module-level gradients of one traced step, derived from the node hooks: a module call's
`grad_input` is what the nodes inside it sent to its inputs (summed where several did), its
`grad_output` what arrived at the nodes that made its outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gradscape.tracer._model import ModuleCall, ModuleTrace, StepTrace, TensorTrace
from gradscape.tracer.record.forward import ForwardRecorder, ModuleCallRecord
from gradscape.tracer.record.lazy_modules import LazyModules
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.record.tables import LazyNodes
from gradscape.tracer.summary.stats import grad_off
from gradscape.tracer.summary.summariser import Summariser


@dataclass(slots=True)
class CallPlan:
    """One module call, by node ids (no torch object: a carried step reuses it, NOTE [Carried forwards] in
    tracer/record/carry.py): its name, each input's gradient edge (node id, input nr) and the (node, slot)
    pairs inside the call that send to it, and each output's edge."""

    name: str
    inputs: list[tuple[int, int] | None]
    senders: list[list[tuple[int, int]]]
    outputs: list[tuple[int, int] | None]


class ModuleSums:
    """The module calls of one step (`plans`, in forward-start order) and, for each module input that
    several ops inside the call used, the running sum of what they sent to it (`plan`, `add`)."""

    def __init__(self, graph: Any, forward: ForwardRecorder) -> None:
        self.graph, self.forward = graph, forward  # a GraphWalk, or the native recorder's NativeGraph
        self.plans: list[CallPlan] | None = None  # by `plan` (each backward's start) or `use`
        self.marks: list[tuple[int, int, tuple[int, int]]] = []  # the plans' `sum_marks`
        self.sums: dict[tuple[int, int], torch.Tensor] = {}  # (call, input) → the sum so far, on the device

    def _edge(self, edge: tuple[Any, int] | None) -> tuple[int, int] | None:
        nid = None if edge is None else self.graph.id_of(edge[0])
        return None if nid is None or edge is None else (nid, edge[1])

    def _plan_of(self, call: ModuleCallRecord) -> CallPlan:
        g = self.graph
        inputs = [self._edge(e) for e in call.inputs]
        senders = [[] if e is None else [(rid, j) for rid, j in g.senders_of(e[0], e[1])
                                         if call.lo <= g.seq_of(rid) < call.hi] for e in inputs]
        return CallPlan(call.name, inputs, senders, [self._edge(e) for e in call.outputs])

    def plan(self) -> None:
        """The module calls by node ids, as far as the graph is walked. A module input used by several ops
        inside the module: its grad_input (through this module) is the sum of those slots. Mark them, so
        the hooks add them up on the device."""
        self.use([self._plan_of(c) for c in sorted(self.forward.calls, key=lambda c: c.lo)])

    def use(self, plans: list[CallPlan], marks: list[tuple[int, int, tuple[int, int]]] | None = None,
            fresh: list[tuple[int, int, tuple[int, int]]] | None = None) -> None:
        """Take `plans` as this step's module calls (a carried step takes the kept step's, with their `sum_marks`)
        and mark the slots to add up: those of `fresh` only, when given (the rest were marked by the call before:
        `ForwardCarry.fresh`)."""
        self.plans, self.marks = plans, sum_marks(plans) if marks is None else marks
        set_sum = self.graph.set_sum
        for rid, j, key in self.marks if fresh is None else fresh:
            set_sum(rid, j, key)

    def add(self, key: tuple[int, int], g: torch.Tensor) -> None:
        with grad_off():
            prev = self.sums.get(key)  # (our own copy: added to in place, bitwise `prev + g`, with no new tensor)
            if prev is None:
                self.sums[key] = g.detach().clone()
            else:
                prev.add_(g.detach())

    def summaries(self, summariser: Summariser, native: Any = None) -> dict[tuple[int, int], TensorTrace | int]:
        """The sums summarised: by the native recorder in one call where it records the step (`native`, its
        `NativeStep`), each one its row of the step's tensor table (an int, made a `TensorTrace` when read:
        NOTE [Lazy module calls]) where the kernel took it; else by the summariser."""
        sums = self.sums
        if native is None or not sums:
            return {key: summariser.summarise(t) for key, t in sums.items()}
        rows = native.summarise(list(sums.values()))
        return {key: row if row >= 0 else summariser.summarise(t) for (key, t), row in zip(sums.items(), rows)}

    def module_traces(self, st: StepTrace, sums: dict[tuple[int, int], TensorTrace | int],
                      model: ModelIndex) -> dict[str, ModuleTrace] | LazyModules:
        """Every module of the model with its calls; `sums`: the summaries of `self.sums`. A natively recorded
        step's are made when first read (NOTE [Lazy module calls] in tracer/record/lazy_modules.py)."""
        # forward post-hooks run innermost first; present calls in forward-start order
        plans = self.plans if self.plans is not None else \
            [self._plan_of(c) for c in sorted(self.forward.calls, key=lambda c: c.lo)]
        nodes = st.nodes
        if isinstance(nodes, LazyNodes):
            return LazyModules(nodes.tables, plans, sums, model.module_types, model.module_params)
        mods: dict[str, ModuleTrace] = {}
        params = model.module_params
        for qual, typ in model.module_types.items():
            mods[qual] = ModuleTrace(qual, typ, [], params.get(qual, []))
        for ci, p in enumerate(plans):
            gi: list[TensorTrace | None] = []
            for k, (edge, prods) in enumerate(zip(p.inputs, p.senders)):
                if edge is None:
                    gi.append(None)
                elif len(prods) == 1:
                    gi.append(_slot(nodes[prods[0][0]].grad_inputs, prods[0][1]))
                else:
                    t = sums.get((ci, k))
                    assert not isinstance(t, int)  # rows only where the nodes are tables (LazyModules)
                    gi.append(t)
            go = [None if e is None else _slot(nodes[e[0]].grad_outputs, e[1]) for e in p.outputs]
            out_nodes = [None if e is None else e[0] for e in p.outputs]
            if p.name in mods:
                mods[p.name].calls.append(ModuleCall(gi, go, [None if e is None else e[0] for e in p.inputs],
                                                     out_nodes, out_nodes[0] if out_nodes else None))
        return mods

    def release(self) -> None:
        self.sums = {}
        self.plans, self.marks = None, []


def sum_marks(plans: list[CallPlan]) -> list[tuple[int, int, tuple[int, int]]]:
    """(node, slot, module sum key) of every slot whose gradient `plans` add up: the module inputs that several
    ops inside the call sent to."""
    return [(rid, j, (ci, k)) for ci, p in enumerate(plans) for k, prods in enumerate(p.senders) if len(prods) > 1
            for rid, j in prods]


def _slot(grads: list[TensorTrace | None] | None, j: int) -> TensorTrace | None:
    """Slot `j` of a node's `grad_inputs` or `grad_outputs`, None past its end."""
    return grads[j] if grads is not None and 0 <= j < len(grads) else None
