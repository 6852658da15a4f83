"""Assembly of one traced step's nodes once its hooks are removed: what each walked node ran with,
as plain `NodeTrace`s (no torch objects), and the step's edges."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gradscape.tracer import _compat
from gradscape.tracer._model import NodeTrace
from gradscape.tracer.record.forward import ForwardRecorder
from gradscape.tracer.record.structure import NodeStatics
from gradscape.tracer.record.walk import NodeRecord
from gradscape.tracer.summary.stats import dtype_name

_ACC_SEQ = (1 << 64) - 1  # the sequence number of every AccumulateGrad node (it has no source line)


def _shape(meta: Any) -> tuple[int, ...] | None:
    try:
        return tuple(map(int, meta.shape))  # int(): a symbolic size with a value becomes that value
    except Exception:  # nested tensors and unbacked symbolic shapes have no plain shape
        return None


def _outputs_of(rec: NodeRecord) -> tuple[list[Any], list[str | None]]:
    """Shapes and dtype names of a node's forward outputs. The engine gave every gradient that
    arrived at a node its output's shape and dtype (it checks and casts them against the node's
    input metadata), so a node that ran with all its gradients answers from their summaries;
    the others read the metadata."""
    runs = rec.runs
    if runs:
        gos = runs[0].grad_outputs
        if len(gos) == 1:  # most nodes: one output
            g = gos[0]
            if g is not None:
                return [g.shape], [g.dtype]
        elif None not in gos:
            return [g.shape for g in gos], [g.dtype for g in gos]  # type: ignore[union-attr]
    meta = _compat.input_metadata(rec.node)
    return [_shape(m) for m in meta], [dtype_name(m.dtype) for m in meta]


def edges_of(records: list[NodeRecord]) -> list[tuple[int, int, int]]:
    """(node, child, slot) of every edge between walked nodes."""
    return [(r.id, c[0], j) for r in records for j, c in enumerate(r.children) if c is not None]


def node_traces(records: list[NodeRecord], forward: ForwardRecorder,
                statics_of: Callable[[list[str | None]], list[NodeStatics]]) -> list[NodeTrace]:
    """Every walked node as a `NodeTrace`; `statics_of`: the nodes' slot arguments, labels and schemas
    from their modules (`StepView.slot_statics`). One loop over the nodes, written for speed: it runs
    for every node of every traced step."""
    mods = forward.modules_of([r.seq for r in records])
    outs = [_outputs_of(r) for r in records]  # a node's input shapes are its children's output shapes
    statics = statics_of(mods)
    source_of = forward.source_of
    out: list[NodeTrace] = []
    append = out.append
    for r, st, mod, (o_shapes, o_dtypes) in zip(records, statics, mods, outs):
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
        seq, runs = r.seq, r.runs
        if runs:
            first = runs[0]
            append(NodeTrace(r.id, r.name, r.kind, mod, r.param, None if seq == _ACC_SEQ else source_of(seq),
                             st.schema, first.order, st.labels, st.args, st.input_shapes, st.output_shapes,
                             st.output_dtypes, first.grad_inputs, first.grad_outputs, first.time_us, runs))
        else:
            append(NodeTrace(r.id, r.name, r.kind, mod, r.param, None if seq == _ACC_SEQ else source_of(seq),
                             st.schema, None, st.labels, st.args, st.input_shapes, st.output_shapes,
                             st.output_dtypes, None, None, None, runs))
    return out
