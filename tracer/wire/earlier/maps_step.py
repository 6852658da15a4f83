"""An earlier release's maps (NOTE [Maps of earlier releases] in __init__.py) back to a `StepTrace`, every field
checked: `step_from_wire` raises `TraceFormatError` naming the first field that is wrong (nothing else escapes
it, whatever the input: tests/test_wire.py drives random mutations of real steps through it). The step's
fields and tensors are read as a column document's are (`tracer.wire.validation`); the nodes and edges here.
"""

from __future__ import annotations

from typing import Any

from gradscape.tracer._model import NodeRun, NodeTrace, StepTrace, fill
from gradscape.tracer.collector import collector_paused
from gradscape.tracer.wire import fast_read
from gradscape.tracer.wire.checks import (
    a_map,
    a_str,
    an_int,
    checked_list,
    opt_int,
    opt_num,
    opt_str,
    str_list,
    versioned,
)
from gradscape.tracer.wire.earlier import fast_nodes
from gradscape.tracer.wire.types import TensorNumpy, TraceFormatError
from gradscape.tracer.wire.validation import Refs, fields_from_wire, tensor_from_wire


@collector_paused()  # NOTE [Collector paused] in tracer/collector.py
def step_from_wire(d: Any, arrays: dict[int, TensorNumpy] | None = None) -> StepTrace:
    """Rebuild a `StepTrace`; raises `TraceFormatError` naming the first field that is wrong. `arrays`: the
    (thumbnail, values) of tensors by index, already read as arrays (`TraceStore.read_step`, which keeps
    them apart from the graph), set on the tensors built."""
    d = versioned(d)
    for key in ("run", "step", "nodes", "edges", "tensors"):
        if key not in d:
            raise TraceFormatError(f"step: missing field {key!r}")
    # the common form is read quickly, the rest checked field by field (NOTE [Fast read] in tracer/wire/fast_read.py)
    tensors = [fast if (fast := fast_read.tensor(t)) is not None else tensor_from_wire(t, f"tensors[{i}]")
               for i, t in enumerate(checked_list(d["tensors"], "tensors"))]
    for i, (thumb, values) in (arrays or {}).items():
        if not 0 <= i < len(tensors):
            raise TraceFormatError(f"arrays: tensor {i} is not one of the step's {len(tensors)}")
        tensors[i].thumb, tensors[i].values = thumb, values
    refs = Refs(tensors, len(checked_list(d["nodes"], "nodes")))
    st = fields_from_wire(d, refs)
    fill(st, nodes=[built if (built := fast_nodes.node(n, k, tensors)) is not None else _node(n, k, refs)
                    for k, n in enumerate(d["nodes"])], edges=_edges(d["edges"], refs.n_nodes))
    for k, e in enumerate(checked_list(d.get("execution") or [], "execution")):
        if not (isinstance(e, list) and len(e) == 2 and type(e[1]) is int and e[1] >= 0):
            raise TraceFormatError(f"execution[{k}]: {e!r} is not [node id, run index]")
        st.execution.append((refs.node(e[0], f"execution[{k}]", False) or 0, e[1]))
    return st



def _node(n: Any, k: int, refs: Refs) -> NodeTrace:
    w = f"nodes[{k}]"
    n = a_map(n, w)
    if n.get("id") != k or type(n.get("id")) is not int:
        raise TraceFormatError(f"{w}.id: expected {k}, got {n.get('id')!r} (ids are positions)")
    runs = []
    for j, r in enumerate(checked_list(n.get("runs") or [], f"{w}.runs")):
        wr = f"{w}.runs[{j}]"
        if not isinstance(r, list) or len(r) != 5:
            raise TraceFormatError(f"{wr}: expected [pass, order, go, gi, time_us]")
        runs.append(NodeRun(an_int(r[0], f"{wr}.pass"), an_int(r[1], f"{wr}.order"),
                            refs.tensor_list(checked_list(r[2], f"{wr}.go"), f"{wr}.go") or [],
                            refs.tensor_list(r[3], f"{wr}.gi"), opt_num(r[4], f"{wr}.time_us")))
    return NodeTrace(
        id=k, name=a_str(n.get("name"), f"{w}.name"), kind=a_str(n.get("kind", "op"), f"{w}.kind"),
        module=opt_str(n.get("module"), f"{w}.module"), param=opt_str(n.get("param"), f"{w}.param"),
        source=opt_str(n.get("source"), f"{w}.source"), schema=opt_str(n.get("schema"), f"{w}.schema"),
        order=opt_int(n.get("order"), f"{w}.order"),
        input_labels=str_list(n.get("labels"), f"{w}.labels"), input_args=str_list(n.get("args"), f"{w}.args"),
        input_shapes=_shapes(n.get("in_shapes"), f"{w}.in_shapes"),
        output_shapes=_shapes(n.get("out_shapes"), f"{w}.out_shapes"),
        output_dtypes=str_list(n.get("out_dtypes"), f"{w}.out_dtypes", optional=True),
        grad_inputs=refs.tensor_list(n.get("gi"), f"{w}.gi"), grad_outputs=refs.tensor_list(n.get("go"), f"{w}.go"),
        time_us=opt_num(n.get("t"), f"{w}.t"), runs=runs,
    )


def _edges(edges: Any, n_nodes: int) -> list[tuple[int, int, int]]:
    out = []
    for k, e in enumerate(checked_list(edges, "edges")):
        if type(e) is list and len(e) == 3:
            a, b, slot = e
            if type(a) is int and type(b) is int and type(slot) is int and 0 <= a < n_nodes and 0 <= b < n_nodes:
                out.append((a, b, slot))
                continue
        if not (isinstance(e, list) and len(e) == 3 and all(type(x) is int for x in e)) or \
                not (0 <= e[0] < n_nodes and 0 <= e[1] < n_nodes):
            raise TraceFormatError(f"edges[{k}]: {e!r} is not [src, dst, slot] with node ids in 0..{n_nodes - 1}")
        out.append((e[0], e[1], e[2]))
    return out


def _shapes(v: Any, where: str) -> list[tuple[int, ...] | None]:
    out: list[tuple[int, ...] | None] = []
    for k, s in enumerate(checked_list(v or [], where)):
        if s is None:
            out.append(None)
            continue
        if not isinstance(s, list) or not all(type(x) is int and x >= 0 for x in s):
            raise TraceFormatError(f"{where}[{k}]: expected a list of non-negative ints or nil, got {s!r:.80}")
        out.append(tuple(s))
    return out
