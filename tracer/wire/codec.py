"""A `StepTrace`'s wire fields but its nodes, edges and tensors (`step_fields`, the column document's fields:
tracer/record/wire_columns.py, trace_columns.py), each tensor's map (`TensorTable`), and msgpack bytes and
back (`pack`, `unpack`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from gradscape.tracer._model import STAT_NAMES, OptimizerStep, StepTrace, TensorTrace
from gradscape.tracer.wire.arrays import encode_array
from gradscape.tracer.wire.checks import plain
from gradscape.tracer.wire.types import (
    TensorNumpy,
    TensorRefs,
    TraceFormatError,
    WireModule,
    WireOptimizerStep,
    WirePass,
    WireTensor,
)
from gradscape.tracer.wire.versions import WIRE_VERSION


class TensorTable:
    """The step's "tensors" list: each distinct `TensorTrace` once, referred to by its position. With
    `apart`, the tensors are written without their arrays, which are kept in `arrays` by position. With
    `base`, positions below it are the step's tensor rows (NOTE [Column document] in tracer/wire/columns.py)
    and `items` lists the tensors after them; `known` gives the rows' positions of the objects made of them."""

    def __init__(self, apart: bool = False, base: int = 0, known: dict[int, int] | None = None) -> None:
        self.items: list[WireTensor] = []
        self._index: dict[int, int] = known or {}
        self.arrays: list[TensorNumpy] | None = [] if apart else None
        self.base = base
        # a natively recorded step's writer sets it: the index of a row of the step's tensor table (NOTE [Lazy
        # module calls] in tracer/record/lazy_modules.py)
        self.row_ref: Callable[[int], int | None] | None = None

    def ref(self, t: TensorTrace | None) -> int | None:
        if t is None:
            return None
        i = self._index.get(id(t))
        if i is None:
            i = self._index[id(t)] = self.base + len(self.items)
            if self.arrays is None:
                self.items.append(tensor_to_wire(t))
            else:
                self.items.append(tensor_summary(t))
                self.arrays.append((t.thumb, t.values))
        return i

    def refs(self, ts: list[TensorTrace | None] | None) -> TensorRefs | None:
        return None if ts is None else self.refs_all(ts)

    def refs_all(self, ts: Sequence[TensorTrace | None]) -> TensorRefs:
        index, ref = self._index, self.ref
        return [None if t is None else index[id(t)] if id(t) in index else ref(t) for t in ts]


_NANS = (float("nan"),) * len(STAT_NAMES)  # a statistic a tensor does not have


def tensor_summary(t: TensorTrace) -> WireTensor:
    return {"shape": list(t.shape), "dtype": t.dtype,
            "stats": list(map(float, map(t.stats.get, STAT_NAMES, _NANS))),
            "view": t.thumb_view, "device": t.device}


def tensor_to_wire(t: TensorTrace) -> WireTensor:
    return {**tensor_summary(t), "thumb": None if t.thumb is None else encode_array(t.thumb),
            "values": None if t.values is None else encode_array(t.values)}


def step_fields(st: StepTrace, tab: TensorTable, execution: bool = True) -> dict[str, Any]:
    """The step's wire fields but its `nodes`, `edges` and `tensors` (entered in `tab`); without `execution`
    when not `execution` (a column document holds the order in its columns: NOTE [Lazy columns])."""
    from_rows = getattr(st.modules, "wire_modules", None)  # NOTE [Lazy module calls]
    modules: dict[str, WireModule] | None = None if from_rows is None else from_rows(tab)
    if modules is None:
        modules = {name: {"type": m.type, "params": list(m.params),
                          "calls": [{"gi": tab.refs_all(c.grad_input), "go": tab.refs_all(c.grad_output),
                                     "in": list(c.input_nodes), "out": list(c.output_nodes), "last": c.last_op}
                                    for c in m.calls]}
                   for name, m in st.modules.items()}
    passes: list[WirePass] = [{"index": p.index, "api": p.api, "roots": list(p.roots),
               "root_grads": tab.refs_all(p.root_grads),
               "retain_graph": p.retain_graph, "create_graph": p.create_graph, "start": p.start, "end": p.end}
              for p in st.passes]
    fields: dict[str, Any] = {"v": WIRE_VERSION, "run": st.run, "step": st.step, "error": st.error,
                              "meta": plain(st.meta, "meta"), "modules": modules,
                              "params": {k: tab.ref(v) for k, v in st.params.items()}, "passes": passes}
    if execution:
        fields["execution"] = [list(e) for e in st.execution]
    return {**fields,
            "problems": [{"kind": p.kind, "message": p.message, "node": p.node, "param": p.param,
                          "source": p.source} for p in st.problems],
            "not_in_step": list(st.not_in_step),
            "rank": st.rank, "world_size": st.world_size, "trigger": st.trigger,
            "optimizer_steps": [optimizer_step_to_wire(o) for o in st.optimizer_steps]}


def optimizer_step_to_wire(o: OptimizerStep) -> WireOptimizerStep:
    return {"optimizer": o.optimizer, "params": list(o.params), "lr": [float(x) for x in o.lr],
            "scale": o.scale, "skipped": o.skipped, "grad_norm": o.grad_norm,
            "grad_norm_before_clip": o.grad_norm_before_clip}


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes | memoryview) -> Any:  # its callers pause the collector around a big document (`read_graph`)
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack's errors, and TypeError for a map key Python cannot hash
        raise TraceFormatError(f"not a msgpack document: {exc}") from exc
