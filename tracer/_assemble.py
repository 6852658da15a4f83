"""Assembly of one traced step's `StepTrace` once its hooks are removed, and the per-`Tracer`
cache of what a trace takes from the graph's structure alone.
"""

from __future__ import annotations

from typing import Any

import torch

from gradscape.tracer._labels import ACCUMULATE, SlotInfo, label_slots, schema_of, slot_args
from gradscape.tracer._model import NodeTrace, StepTrace, TensorTrace
from gradscape.tracer._state import RecorderState
from gradscape.tracer._summary import dtype_name
from gradscape.tracer._walk import _Rec

_ACC_SEQ = (1 << 64) - 1


def _shape(meta: Any) -> tuple[int, ...] | None:
    try:
        return tuple(map(int, meta.shape))  # int(): a symbolic size with a value becomes that value
    except Exception:  # nested tensors and unbacked symbolic shapes have no plain shape
        return None


def _outputs_of(rec: _Rec) -> tuple[list[Any], list[str | None]]:
    """Shapes and dtype names of a node's forward outputs. The engine gave every gradient that
    arrived at a node its output's shape and dtype (it checks and casts them against the node's
    `_input_metadata`), so a node that ran with all its gradients answers from their summaries;
    the others read the metadata."""
    if rec.runs:
        gos = rec.runs[0].grad_outputs
        if None not in gos:
            return [g.shape for g in gos], [g.dtype for g in gos]  # type: ignore[union-attr]
    meta = rec.node._input_metadata
    return [_shape(m) for m in meta], [dtype_name(m.dtype) for m in meta]


class _Static:
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

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._entries: dict[Any, list[_Static]] = {}

    def get(self, key: Any) -> list[_Static] | None:
        return self._entries.get(key)

    def put(self, key: Any, value: list[_Static]) -> list[_Static]:
        if len(self._entries) >= self.size:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = value
        return value


def _after_step(*args: Any) -> Any:
    raise RuntimeError("gradscape: this step's recorder has finished")


class AssembleMixin(RecorderState):
    # ------------------------------------------------------------------ assembly
    def finish(self, error: BaseException | None = None) -> StepTrace:
        """Stop hooks, fetch summaries, and build the `StepTrace`. Drops every torch reference."""
        self.stop_hooks()
        recs = self.recs
        for pos, (rid, k) in enumerate(self.execution):
            recs[rid].runs[k].order = pos
        module_grad_sums = self._module_sums()
        self.summ.finalize()
        st = StepTrace(run=self.run, step=self.step)
        st.nodes = self._node_traces()
        st.edges = [(r.id, c[0], j) for r in self.recs for j, c in enumerate(r.children) if c is not None]
        st.passes = self.passes
        st.execution = list(self.execution)
        st.params = dict(self._param_trace)
        st.modules = self._module_traces(st, module_grad_sums)
        if not self.passes and not self.notes and error is None:
            self._note_once("no backward ran inside the traced step, so its trace is empty (call backward() "
                            "or torch.autograd.grad() inside the `with tr.step(i)` block)")
        st.meta = {"torch": torch.__version__, "nodes": len(st.nodes), "passes": len(self.passes)}
        if self.notes:
            st.meta["notes"] = list(self.notes)
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            st.rank, st.world_size = dist.get_rank(), dist.get_world_size()
        if error is not None:
            st.error = f"{type(error).__name__}: {error}"
        st.problems = self.problems.finish(st, self)  # the problem finder (tracer/_problems.py)
        self._release()
        return st

    def _release(self) -> None:
        self.recs = []
        self.ids = {}
        self._pending = {}
        self._arrived = {}
        self._param_by_name = {}
        self._module_acc = {}
        self._hidden = {}
        self._calls = []
        self._index = {}
        self.forward.calls = []
        self.forward.on_backward = _after_step  # the recorder ↔ forward recorder cycle, broken: freed by refcount
        self.module_names = {}
        self.param_names = {}

    def _node_traces(self) -> list[NodeTrace]:
        recs = self.recs
        mods = self.forward.modules_of([r.seq for r in recs])
        outs = [_outputs_of(r) for r in recs]  # a node's input shapes are its children's output shapes
        statics = self.slot_statics(mods)
        source_of = self.forward.source_of
        out = []
        for r, st, mod, (o_shapes, o_dtypes) in zip(recs, statics, mods, outs):
            in_shapes: list[Any] = []
            for c in r.children:
                if c is None:
                    in_shapes.append(None)
                else:
                    shapes = outs[c[0]][0]
                    in_shapes.append(shapes[c[1]] if c[1] < len(shapes) else None)
            # an unchanged list is the one the previous step's trace holds (StructureCache)
            if in_shapes != st.input_shapes:
                st.input_shapes = in_shapes
            if o_shapes != st.output_shapes:
                st.output_shapes = o_shapes
            if o_dtypes != st.output_dtypes:
                st.output_dtypes = o_dtypes
            seq = r.seq
            runs = r.runs
            order: int | None = None
            gi: list[TensorTrace | None] | None = None
            go: list[TensorTrace | None] | None = None
            time_us: float | None = None
            if runs:
                first = runs[0]
                order, gi, go, time_us = first.order, first.grad_inputs, first.grad_outputs, first.time_us
            out.append(NodeTrace(r.id, r.name, r.kind, mod, r.param, None if seq == _ACC_SEQ else source_of(seq),
                                 st.schema, order, st.labels, st.args, st.input_shapes, st.output_shapes,
                                 st.output_dtypes, gi, go, time_us, runs))
        return out

    def slot_statics(self, mods: list[str | None]) -> list[_Static]:
        """Every walked node's slot arguments, labels and schema, from the `StructureCache` (computed
        and cached on a miss); `mods`: the nodes' modules (`forward.modules_of`), in walk order. Also
        read while a backward is paused at a breakpoint (tracer/_breakpoints.py): the graph is walked
        before the backward runs, so the labels are already those of the finished step."""
        recs = self.recs
        key = tuple((type(r.node), r.name, r.kind, mod, r.param, tuple(r.children),
                     tuple(r.node.variable.shape) if r.kind == "leaf" else None)  # labels name a leaf's shape
                    for r, mod in zip(recs, mods))
        statics = self.statics.get(key)
        if statics is None:
            statics = self.statics.put(key, self._statics(mods))
        return statics

    def _statics(self, mods: list[str | None]) -> list[_Static]:
        """Slot arguments, labels and schema of every node: they depend only on the graph's structure
        (see `StructureCache`)."""
        infos = []
        for r, mod in zip(self.recs, mods):
            leaf_shape = tuple(r.node.variable.shape) if r.name == ACCUMULATE else None
            infos.append(SlotInfo(r.name, r.kind, mod, r.param, leaf_shape,
                                  [None if c is None else c[0] for c in r.children]))
        statics = []
        for r, info in zip(self.recs, infos):
            child_params = [infos[c[0]].param if c is not None else None for c in r.children]
            fwd_cls = getattr(type(r.node), "_forward_cls", None)
            args = slot_args(r.name, r.kind, len(r.children), fwd_cls, child_params)
            labels = label_slots(infos, r.id, args)
            if r.kind == "compiled" and info.module:
                labels = [lab.replace("graph input", f"compiled {info.module}: input") for lab in labels]
            statics.append(_Static(args, labels, schema_of(r.name) if r.kind == "op" else None))
        return statics
