"""`StepView`: what the debugger (tracer/record/debug/breakpoints.py) and the problem finder
(tracer/record/debug/problems.py) may read of a step while it is recorded, typed, in one place. They read
through it, never the recorder's own state; it holds no reference back to the recorder."""

from __future__ import annotations

from gradscape.tracer.record.forward import ForwardRecorder
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.record.structure import NodeStatics, StructureCache, slot_statics
from gradscape.tracer.record.walk import GraphWalk, NodeRecord
from gradscape.tracer.summary.summariser import Summariser


class StepView:
    """A read interface to one step being recorded. `recs`: the walked nodes (ids are positions);
    `execution`: (node id, run index) of every node run so far, in order; `forward`: the module calls
    and source lines of the forward; `summ`: its summariser (`finalize` fetches what the hooks made so
    far); `model`: the model's names."""

    __slots__ = ("step", "execution", "forward", "summ", "model", "_walk", "_structure")

    def __init__(self, step: int, walk: GraphWalk, execution: list[tuple[int, int]], forward: ForwardRecorder,
                 summariser: Summariser, model: ModelIndex, structure: StructureCache) -> None:
        self.step, self.execution, self.forward, self.summ, self.model = step, execution, forward, summariser, model
        self._walk, self._structure = walk, structure

    @property
    def recs(self) -> list[NodeRecord]:
        return self._walk.records

    def slot_statics(self, mods: list[str | None]) -> list[NodeStatics]:
        """Every walked node's slot arguments, labels and schema (`structure.slot_statics`)."""
        return slot_statics(self._walk.records, mods, self._structure)
