"""The serialised step, defined once: what the tracer sends, the server checks, the store keeps and the
API and the view read. Plain msgpack maps, arrays as raw little-endian bytes. The names below are the
schema's public face; each lives in the module of its concern:

    types       the wire form as TypedDicts (`WireStep`, `WireNode`, ...) and `TraceFormatError`
    versions    `WIRE_VERSION`, and what a field an earlier writer left out means (`with_defaults`)
    arrays      arrays as maps of dtype, shape and bytes (`encode_array`, `decode_array`)
    views       the 2-D view a thumbnail shows (`matrix_shape`, `thumbnail_view`)
    codec       a step's fields but its nodes (`step_fields`), its tensor maps, msgpack bytes (`pack`, `unpack`)
    checks      the checks of a step's values (strings, ints, lists, maps, `meta`'s plain values)
    field_check a step's fields but its nodes and tensors, checked in place (`checked_fields`)
    validation  a step's fields and tensor maps → `StepTrace` parts, every field checked
    compact     thumbnails as the trace file keeps them: 8 bits a cell with their range, repeats once
    history     the run's history rows (the monitor's), a schema of its own (`history_to_wire`, ...)
    fast_read   a tensor map in its common form, read quickly (NOTE [Fast read])

The store, the socket sink and `st.to_html()` write a step as a column document (NOTE [Column document] in
columns.py), whichever recorder made it, and the page and the offline page read that document. Nothing
writes a step's maps any more; they are read from files of earlier releases and from earlier tracers that
send them, by the subpackage `earlier` (NOTE [Maps of earlier releases] in earlier/__init__.py: `maps_step`,
`fast_nodes`, `spans`; `step_from_wire`):

    columns        the document and `StepColumns`, read back as the maps they stand for
    column_doc     the document's one writer: codes, plans and layout, whichever form the nodes are in
    column_write   a step's columns, asked of the step itself (the store and the socket sink)
    trace_columns  the columns of a step whose nodes are a list (read from maps, built by hand), or refused
    column_check   a step sent as columns, checked as the server checks the wire form
    column_read    a stored column step read back as a `StepTrace`
    column_index   its index from the columns

and what the page reads first: step_index (NOTE [Step index]: every node's module, name and colour
values) and lazy (a stored step whose node and tensor maps are made when read).

No pickle anywhere: a trace is data (`dict`/`list`/`str`/numbers/`bytes`), never code. `step_from_wire`
checks every field and raises `TraceFormatError` naming the first one that is wrong.

The maps, version `WIRE_VERSION` (every key is always present; a column document holds the same fields but
"nodes", "edges", "tensors" and "execution", whose maps its columns make when read):
    {"v": 1, "run": str, "step": int, "error": str|None, "meta": {...},
     "tensors": [T, ...],                      # each distinct TensorTrace once; others refer by index
     "nodes": [{"id", "name", "kind", "module", "param", "source", "schema", "order",
                "labels": [str], "args": [str], "in_shapes": [[int]|None], "out_shapes": [[int]|None],
                "out_dtypes": [str|None], "gi": [int|None]|None, "go": [int|None]|None, "t": float|None,
                "runs": [[pass, order, go, gi, t], ...]}],
     "edges": [[src, dst, slot], ...],
     "modules": {name: {"type", "params": [str], "calls": [{"gi", "go", "in", "out", "last"}]}},
     "params": {name: int}, "passes": [{"index", "api", "roots", "root_grads", "retain_graph",
                                       "create_graph", "start", "end"}], "execution": [[node, run], ...],
     "problems": [{"kind", "message", "node", "param", "source"}], "not_in_step": [str],
     "rank": int|None, "world_size": int|None,
     "trigger": str|None, "optimizer_steps": [{"optimizer", "params", "lr", "scale", "skipped", "grad_norm",
                                               "grad_norm_before_clip"}]}
    Node fields hold node ids (positions in "nodes") and tensor indices (positions in "tensors").
    T = {"shape": [int], "dtype": str, "stats": [min, max, mean, std, norm, nan, inf, zeros],
         "view": str, "device": str, "thumb": A|None, "values": A|None}
    A = {"dtype": "<f4"|"<f8"|..., "shape": [int], "data": bytes}
"""

from gradscape.tracer._model import STAT_NAMES
from gradscape.tracer.wire.arrays import MAX_ARRAY_ELEMENTS, decode_array, encode_array
from gradscape.tracer.wire.checks import checked_list, opt_str, str_list
from gradscape.tracer.wire.codec import pack, tensor_to_wire, unpack
from gradscape.tracer.wire.earlier.maps_step import step_from_wire
from gradscape.tracer.wire.types import (
    TensorArrays,
    TensorRefs,
    TraceFormatError,
    WireArray,
    WireCall,
    WireModule,
    WireNode,
    WireOptimizerStep,
    WirePass,
    WireProblem,
    WireRun,
    WireStep,
    WireTensor,
    node_runs,
)
from gradscape.tracer.wire.validation import tensor_from_wire
from gradscape.tracer.wire.versions import WIRE_VERSION, with_defaults
from gradscape.tracer.wire.views import matrix_shape, thumbnail_view

__all__ = [
    "MAX_ARRAY_ELEMENTS", "STAT_NAMES", "WIRE_VERSION", "TensorArrays", "TensorRefs", "TraceFormatError", "WireArray",
    "WireCall", "WireModule", "WireNode", "WireOptimizerStep", "WirePass", "WireProblem", "WireRun", "WireStep",
    "WireTensor",
    "checked_list", "decode_array", "encode_array", "matrix_shape", "node_runs", "opt_str", "pack", "step_from_wire",
    "str_list", "tensor_from_wire", "tensor_to_wire", "thumbnail_view", "unpack", "with_defaults",
]
