"""A tensor map read quickly (a column document's `extra` tensors, an earlier release's tensor maps): one whose
every field is exactly as gradscape writes it is built here, and anything else gets None, for the checked
reader (`validation.tensor_from_wire`) to build or to name what is wrong. An earlier release's node maps are
read so too (`earlier/fast_nodes.py`).

NOTE [Fast read]
    The checked reader formats the place of every field it checks (`nodes[17].runs[0].go[1]`) before it
    knows whether the field is wrong: a 100,002-node step took 8.6 s to load, most of it in those
    checks. These functions test the same conditions on the values alone, so they accept a subset of
    what the checked reader accepts (exact `str`, `int` and `list` types: what msgpack decodes to) and
    build the same objects from it. tests/test_wire.py holds them to that on real and mutated steps.
"""

from __future__ import annotations

from typing import Any

from gradscape.tracer._model import STAT_NAMES, TensorTrace
from gradscape.tracer.wire.arrays import decode_array
from gradscape.tracer.wire.types import TraceFormatError

_N_STATS = len(STAT_NAMES)


def tensor(d: Any) -> TensorTrace | None:
    """A tensor, or None."""
    if type(d) is not dict:
        return None
    shape, stats, dtype = d.get("shape"), d.get("stats"), d.get("dtype")
    view, device, thumb, values = d.get("view", ""), d.get("device", "cpu"), d.get("thumb"), d.get("values")
    if type(shape) is not list or type(stats) is not list or len(stats) != _N_STATS or type(dtype) is not str \
            or type(view) is not str or type(device) is not str \
            or (thumb is not None and type(thumb) is not dict) or (values is not None and type(values) is not dict):
        return None
    for s in shape:
        if type(s) is not int or s < 0:
            return None
    for v in stats:
        if type(v) is not float and type(v) is not int:
            return None
    try:  # the arrays check themselves; the checked reader names the place when they are wrong
        thumb = None if thumb is None else decode_array(thumb, "thumb")
        values = None if values is None else decode_array(values, "values")
    except TraceFormatError:
        return None
    return TensorTrace(shape=tuple(shape), dtype=dtype, stats=dict(zip(STAT_NAMES, map(float, stats))),
                       thumb=thumb, thumb_view=view, device=device, values=values)
