"""Module-level gradients of one traced step, derived from the node hooks: a module call's
`grad_input` is what the nodes inside it sent to its inputs (summed where several did), its
`grad_output` what arrived at the nodes that made its outputs.
"""

from __future__ import annotations

from typing import Any

import torch

from gradscape.tracer._model import ModuleCall, ModuleTrace, StepTrace, TensorTrace
from gradscape.tracer.record.forward import ForwardRecorder, ModuleCallRecord
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.record.tables import grad_of
from gradscape.tracer.summary.stats import grad_off
from gradscape.tracer.summary.summariser import Summariser


class ModuleSums:
    """The module calls of one step (`calls`, in forward-start order) and, for each module input that
    several ops inside the call used, the running sum of what they sent to it (`plan`, `add`)."""

    def __init__(self, graph: Any, forward: ForwardRecorder) -> None:
        self.graph, self.forward = graph, forward  # a GraphWalk, or the native recorder's NativeGraph
        self.calls: list[ModuleCallRecord] = []
        self.sums: dict[tuple[int, int], torch.Tensor] = {}  # (call, input) → the sum so far, on the device
        self.senders: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (call, input) → `_senders`, by `plan`

    def _senders(self, call: ModuleCallRecord, edge: tuple[Any, int]) -> list[tuple[int, int]]:
        """The (node, slot) pairs inside this module call that send a gradient to `edge`."""
        g = self.graph
        target = g.id_of(edge[0])
        if target is None:
            return []
        return [(rid, j) for rid, j in g.senders_of(target, edge[1]) if call.lo <= g.seq_of(rid) < call.hi]

    def plan(self) -> None:
        """A module input used by several ops inside the module: its grad_input (through this module)
        is the sum of those slots. Mark them, so the post-hooks add them up on the device."""
        self.calls = sorted(self.forward.calls, key=lambda c: c.lo)
        for ci, call in enumerate(self.calls):
            for k, edge in enumerate(call.inputs):
                if edge is None:
                    continue
                prods = self.senders[(ci, k)] = self._senders(call, edge)
                if len(prods) > 1:
                    for rid, j in prods:
                        self.graph.set_sum(rid, j, (ci, k))

    def add(self, key: tuple[int, int], g: torch.Tensor) -> None:
        with grad_off():
            prev = self.sums.get(key)
            self.sums[key] = g.detach().clone() if prev is None else prev + g.detach()

    def summaries(self, summariser: Summariser) -> dict[tuple[int, int], TensorTrace]:
        return {key: summariser.summarise(t) for key, t in self.sums.items()}

    def module_traces(self, st: StepTrace, sums: dict[tuple[int, int], TensorTrace],
                      model: ModelIndex) -> dict[str, ModuleTrace]:
        """Every module of the model with its calls; `sums`: the summaries of `self.sums`."""
        mods: dict[str, ModuleTrace] = {}
        params = model.module_params
        for qual, typ in model.module_types.items():
            mods[qual] = ModuleTrace(qual, typ, [], params.get(qual, []))
        # forward post-hooks run innermost first; present calls in forward-start order
        calls = self.calls or sorted(self.forward.calls, key=lambda c: c.lo)
        for ci, call in enumerate(calls):
            mc = self._call_trace(st, ci, call, sums)
            if call.name in mods:
                mods[call.name].calls.append(mc)
        return mods

    def _call_trace(self, st: StepTrace, ci: int, call: ModuleCallRecord,
                    sums: dict[tuple[int, int], TensorTrace]) -> ModuleCall:
        id_of = self.graph.id_of
        gi: list[TensorTrace | None] = []
        in_nodes: list[int | None] = []
        for k, edge in enumerate(call.inputs):
            if edge is None:
                gi.append(None)
                in_nodes.append(None)
                continue
            in_nodes.append(id_of(edge[0]))
            prods = self.senders[(ci, k)] if self.calls else self._senders(call, edge)  # planned, or not
            if len(prods) == 1:
                pid, j = prods[0]
                gi.append(grad_of(st.nodes, pid, True, j))
            else:
                gi.append(sums.get((ci, k)))
        go: list[TensorTrace | None] = []
        out_nodes: list[int | None] = []
        for edge in call.outputs:
            nid = None if edge is None else id_of(edge[0])
            out_nodes.append(nid)
            go.append(None if nid is None or edge is None else grad_of(st.nodes, nid, False, edge[1]))
        return ModuleCall(gi, go, in_nodes, out_nodes, out_nodes[0] if out_nodes else None)

    def release(self) -> None:
        self.sums = {}
        self.senders = {}
        self.calls = []
