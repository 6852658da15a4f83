"""Module-level gradients of one traced step, derived from the node hooks: a module call's
`grad_input` is what the nodes inside it sent to its inputs (summed where several did), its
`grad_output` what arrived at the nodes that made its outputs.
"""

from __future__ import annotations

from typing import Any

import torch

from gradscape.tracer._attrib import ModuleCallRecord
from gradscape.tracer._model import ModuleCall, ModuleTrace, StepTrace, TensorTrace
from gradscape.tracer._state import RecorderState
from gradscape.tracer._summary import grad_off


class ModuleSumsMixin(RecorderState):
    # ---- module-level gradients, derived from node hooks (the module docstring says how)
    def _producers(self, call: ModuleCallRecord, edge: tuple[Any, int],
                   index: dict[tuple[int, int], list[tuple[int, int]]]) -> list[tuple[int, int]]:
        """The (node, slot) pairs inside this module call that send a gradient to `edge`."""
        target = self.ids.get(edge[0])
        if target is None:
            return []
        return [(rid, j) for rid, j in index.get((target, edge[1]), ())
                if call.lo <= self.recs[rid].seq < call.hi]

    def _plan_module_sums(self) -> None:
        """A module input used by several ops inside the module: its grad_input (through this module)
        is the sum of those slots. Mark them, so the post-hooks add them up on the device."""
        index = self._index
        self._calls = sorted(self.forward.calls, key=lambda c: c.lo)
        for ci, call in enumerate(self._calls):
            for k, edge in enumerate(call.inputs):
                if edge is None:
                    continue
                prods = self._producers(call, edge, index)
                if len(prods) > 1:
                    for rid, j in prods:
                        rec = self.recs[rid]
                        if rec.sums is None:
                            rec.sums = {}
                        rec.sums[j] = (ci, k)

    def _add_to_module_sum(self, key: tuple[int, int], g: torch.Tensor) -> None:
        with grad_off():
            prev = self._module_acc.get(key)
            self._module_acc[key] = g.detach().clone() if prev is None else prev + g.detach()

    def _module_sums(self) -> dict[tuple[int, int], TensorTrace]:
        return {key: self.summ.summarise(t) for key, t in self._module_acc.items()}

    def _module_traces(self, st: StepTrace, sums: dict[tuple[int, int], TensorTrace]) -> dict[str, ModuleTrace]:
        mods: dict[str, ModuleTrace] = {}
        params = self.module_params
        for qual, typ in self.module_types.items():
            mods[qual] = ModuleTrace(qual, typ, [], params.get(qual, []))
        # forward post-hooks run innermost first; present calls in forward-start order
        index = self._index
        calls = self._calls or sorted(self.forward.calls, key=lambda c: c.lo)
        for ci, call in enumerate(calls):
            gi: list[TensorTrace | None] = []
            in_nodes: list[int | None] = []
            for k, edge in enumerate(call.inputs):
                if edge is None:
                    gi.append(None)
                    in_nodes.append(None)
                    continue
                in_nodes.append(self.ids.get(edge[0]))
                prods = self._producers(call, edge, index)
                if len(prods) == 1:
                    pid, j = prods[0]
                    g = st.nodes[pid].grad_inputs
                    gi.append(g[j] if g is not None and j < len(g) else None)
                else:
                    gi.append(sums.get((ci, k)))
            go: list[TensorTrace | None] = []
            out_nodes: list[int | None] = []
            for edge in call.outputs:
                nid = None if edge is None else self.ids.get(edge[0])
                out_nodes.append(nid)
                gos = st.nodes[nid].grad_outputs if nid is not None else None
                go.append(gos[edge[1]] if gos is not None and edge is not None and edge[1] < len(gos) else None)
            mc = ModuleCall(gi, go, in_nodes, out_nodes, out_nodes[0] if out_nodes else None)
            if call.name in mods:
                mods[call.name].calls.append(mc)
        return mods
