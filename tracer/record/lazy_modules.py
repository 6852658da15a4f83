"""A natively recorded step's module calls (`StepTrace.modules`), made when first read.

NOTE [Lazy module calls]
    A module call's `grad_input` and `grad_output` are gradients the step's nodes already hold: slots of
    its tables (NOTE [Step tables] in tables.py), but for an input that several ops inside the call used,
    whose gradient through the call is their sum (`ModuleSums`, summarised apart: where the native recorder
    records the step, into the tensor table too, in one call at the step's end, so a sum is a row as well;
    the summariser's `TensorTrace` otherwise). Making a `TensorTrace`
    for every slot of every call when the step ended was the largest part of assembling a step with many
    small module calls (the actor-critic program of bench/, W7), for objects most steps never show.

    So a step keeps its calls' plans (`CallPlan`, by node ids) and, when first asked, the tensor-table row
    of every call slot, found for all of them at once with numpy (`slot_rows`). The plans are laid out
    once per plans list (`_layout`); a carried step (NOTE [Carried forwards] in carry.py) reuses its kept
    step's list. The `ModuleTrace`s are made when `StepTrace.modules` is first read, from the same rows,
    so a call holds the very `TensorTrace` objects its nodes do. The wire codec writes unread calls from
    the rows (`wire_modules`), numbering each tensor as it numbers the object made of that row, so the
    wire form is the same either way (tests/test_lazy_modules.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gradscape.tracer._model import ModuleCall, ModuleTrace, TensorTrace
from gradscape.tracer.record.slot_rows import slot_rows
from gradscape.tracer.record.tables import StepTables

_NONE = -1  # a slot code: no gradient (an input that needs none, an output without a node)


class _Layout:
    """The calls of one plans list as slot codes: `>= 0`, a query (node, sent, slot) answered by `slot_rows`;
    `-1`, None; `<= -2`, the module sum `sum_keys[-2 - code]`."""

    __slots__ = ("plans", "q_node", "q_sent", "q_j", "sum_keys", "calls")

    def __init__(self, plans: list[Any]) -> None:
        self.plans = plans
        node: list[int] = []
        sent: list[bool] = []
        slot: list[int] = []
        self.sum_keys: list[tuple[int, int]] = []
        # per call: (module name, gi codes, go codes, input nodes, output nodes)
        self.calls: list[tuple[str, list[int], list[int], list[int | None], list[int | None]]] = []

        def query(nid: int, is_sent: bool, j: int) -> int:
            node.append(nid)
            sent.append(is_sent)
            slot.append(j)
            return len(node) - 1

        for ci, p in enumerate(plans):
            gi: list[int] = []
            for k, (edge, prods) in enumerate(zip(p.inputs, p.senders)):
                if edge is None:
                    gi.append(_NONE)
                elif len(prods) == 1:
                    gi.append(query(prods[0][0], True, prods[0][1]))
                else:
                    gi.append(-2 - len(self.sum_keys))
                    self.sum_keys.append((ci, k))
            go = [_NONE if e is None else query(e[0], False, e[1]) for e in p.outputs]
            self.calls.append((p.name, gi, go, [None if e is None else e[0] for e in p.inputs],
                               [None if e is None else e[0] for e in p.outputs]))
        self.q_node, self.q_sent, self.q_j = node, sent, slot


_LAYOUTS: dict[int, _Layout] = {}  # id of a plans list -> its layout (the list is held by the layout)


def _layout(plans: list[Any]) -> _Layout:
    lay = _LAYOUTS.get(id(plans))
    if lay is None or lay.plans is not plans:
        if len(_LAYOUTS) >= 4:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        lay = _LAYOUTS[id(plans)] = _Layout(plans)
    return lay


class LazyModules(Mapping[str, ModuleTrace]):
    """`StepTrace.modules` of a natively recorded step (NOTE [Lazy module calls]): every module of the model
    (`types`, `params` by name, in the model's order) with its calls, made when first read."""

    def __init__(self, tables: StepTables, plans: list[Any], sums: dict[tuple[int, int], TensorTrace | int],
                 types: dict[str, str], params: dict[str, list[str]]) -> None:
        self.tables = tables
        self.layout = _layout(plans)
        self._rows: list[int] | None = None  # `rows`
        self.sums = sums  # (call, input) → its summary, or its row of the table (`ModuleSums.summaries`)
        self.types, self.params = types, params
        self._made: dict[str, ModuleTrace] | None = None

    @property
    def rows(self) -> list[int]:
        """The table row of each query of the layout (-1: no gradient), found when first asked."""
        if self._rows is None:
            lay = self.layout
            self._rows = slot_rows(self.tables, lay.q_node, lay.q_sent, lay.q_j)
        return self._rows

    def _slot(self, code: int) -> TensorTrace | None:
        if code >= 0:
            row = self.rows[code]
            return None if row < 0 else self.tables.tensors.get(row)
        if code == _NONE:
            return None
        t = self.sums.get(self.layout.sum_keys[-2 - code])
        return self.tables.tensors.get(t) if isinstance(t, int) else t

    def _modules(self) -> dict[str, ModuleTrace]:
        if self._made is None:
            params = self.params
            mods = {q: ModuleTrace(q, typ, [], params.get(q, [])) for q, typ in self.types.items()}
            slot = self._slot
            for name, gi, go, ins, outs in self.layout.calls:
                if name in mods:
                    mods[name].calls.append(ModuleCall([slot(c) for c in gi], [slot(c) for c in go], list(ins),
                                                       list(outs), outs[0] if outs else None))
            self._made = mods
        return self._made

    def __getitem__(self, name: str) -> ModuleTrace:
        return self._modules()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.types)  # the same names, in the same order, as the calls once made

    def __contains__(self, name: object) -> bool:
        return name in self.types

    def __len__(self) -> int:
        return len(self.types)

    def __repr__(self) -> str:
        return f"LazyModules({len(self.types)} modules, {len(self.layout.calls)} calls)"

    def outside_table(self) -> list[TensorTrace]:
        """The calls' tensors that are no row of the step's tensor table: the module sums the summariser made."""
        return [t for t in self.sums.values() if not isinstance(t, int)]

    def wire_modules(self, tab: Any) -> dict[str, Any] | None:
        """The codec's `modules` field (`tracer.wire.codec.step_fields`), tensors entered in `tab` by row
        (`tab.row_ref`); None once the calls were made (the codec writes them from the objects)."""
        row_ref = getattr(tab, "row_ref", None)
        if self._made is not None or row_ref is None:
            return None
        rows, keys, sums = self.rows, self.layout.sum_keys, self.sums

        def ref(code: int) -> int | None:
            if code >= 0:
                row = rows[code]
                return None if row < 0 else row_ref(row)
            if code == _NONE:
                return None
            t = sums.get(keys[-2 - code])
            return row_ref(t) if isinstance(t, int) else tab.ref(t)

        calls: dict[str, list[Any]] = {q: [] for q in self.types}
        for name, gi, go, ins, outs in self.layout.calls:
            if name in calls:
                calls[name].append((gi, go, ins, outs))
        out: dict[str, Any] = {}
        for q, typ in self.types.items():  # modules, then calls, then gi before go: the codec's order
            out[q] = {"type": typ, "params": list(self.params.get(q, [])),
                      "calls": [{"gi": [ref(c) for c in gi], "go": [ref(c) for c in go], "in": list(ins),
                                 "out": list(outs), "last": outs[0] if outs else None}
                                for gi, go, ins, outs in calls[q]]}
        return out
