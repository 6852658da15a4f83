"""A step's fields and tensor maps back to `StepTrace` parts, every field checked, for a column document
(`column_read`) and an earlier release's maps (`earlier/maps_step.py`) alike: `fields_from_wire` and
`tensor_from_wire` raise `TraceFormatError` naming the first field that is wrong."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gradscape.tracer._model import (
    STAT_NAMES,
    BackwardPass,
    ModuleCall,
    ModuleTrace,
    OptimizerStep,
    Problem,
    StepTrace,
    TensorTrace,
)
from gradscape.tracer.wire.arrays import decode_array
from gradscape.tracer.wire.checks import (
    a_str,
)
from gradscape.tracer.wire.field_check import Counts, checked_fields
from gradscape.tracer.wire.types import TraceFormatError


def tensor_from_wire(d: dict[str, Any], where: str = "tensor") -> TensorTrace:
    if not isinstance(d, dict):
        raise TraceFormatError(f"{where}: expected a map, got {type(d).__name__}")
    shape = d.get("shape")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise TraceFormatError(f"{where}.shape: expected a list of non-negative ints, got {shape!r}")
    stats = d.get("stats")
    if not isinstance(stats, list) or len(stats) != len(STAT_NAMES) or \
            not all(type(v) in (int, float) for v in stats):
        raise TraceFormatError(f"{where}.stats: expected {len(STAT_NAMES)} numbers ({' '.join(STAT_NAMES)})")
    thumb = d.get("thumb")
    values = d.get("values")
    if thumb is not None and not isinstance(thumb, dict) or values is not None and not isinstance(values, dict):
        raise TraceFormatError(f"{where}.thumb/values: expected an array map or nil")
    return TensorTrace(
        shape=tuple(shape), dtype=a_str(d.get("dtype"), f"{where}.dtype"),
        stats=dict(zip(STAT_NAMES, (float(v) for v in stats))),
        thumb=None if thumb is None else decode_array(thumb, f"{where}.thumb"),
        thumb_view=a_str(d.get("view", ""), f"{where}.view"), device=a_str(d.get("device", "cpu"), f"{where}.device"),
        values=None if values is None else decode_array(values, f"{where}.values"),
    )


class Refs(Counts):
    """`Counts` with the step's tensors themselves ("tensors": any sequence of them, made when read for a
    column step), which a node's or a field's indices resolve to."""

    def __init__(self, tensors: Sequence[TensorTrace], n_nodes: int) -> None:
        super().__init__(len(tensors), n_nodes)
        self.tensors = tensors

    def tensor_list(self, ix: Any, where: str) -> list[TensorTrace | None] | None:
        return None if ix is None else [None if i is None else self.tensors[i] for i in self.tensor_refs(ix, where)]


def fields_from_wire(d: dict[str, Any], refs: Refs) -> StepTrace:
    """A `StepTrace` of the step's fields but its nodes, edges and execution order, checked by `checked_fields`
    (NOTE [Fields checked in place]): `refs` holds the tensors they name and the step's node count."""
    f = checked_fields(d, refs)
    tensors = refs.tensors

    def of(ix: list[int | None]) -> list[TensorTrace | None]:
        return [None if i is None else tensors[i] for i in ix]

    modules = {name: ModuleTrace(name=name, type=m["type"], params=m["params"],
                                 calls=[ModuleCall(of(c["gi"]), of(c["go"]), c["in"], c["out"], c["last"])
                                        for c in m["calls"]])
               for name, m in f["modules"].items()}
    passes = [BackwardPass(index=p["index"], api=p["api"], roots=p["roots"], root_grads=of(p["root_grads"]),
                           retain_graph=p["retain_graph"], create_graph=p["create_graph"], start=p["start"],
                           end=p["end"]) for p in f["passes"]]
    return StepTrace(run=f["run"], step=f["step"], modules=modules,
                     params={name: tensors[i] for name, i in f["params"].items()}, passes=passes, meta=f["meta"],
                     error=f["error"], problems=[Problem(**p) for p in f["problems"]], not_in_step=f["not_in_step"],
                     rank=f["rank"], world_size=f["world_size"], trigger=f["trigger"],
                     optimizer_steps=[OptimizerStep(**o) for o in f["optimizer_steps"]])
