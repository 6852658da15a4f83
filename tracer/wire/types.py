"""The wire form as types, and the error raised when data does not fit them.

A column document's columns make the node and tensor maps when read (`columns.StepColumns`), the codec
makes the step's other fields and its tensor maps (`step_fields`, `TensorTable`), an earlier release's maps
are checked by `step_from_wire` (earlier/maps_step.py), and the JSON API and the view read them. They are
plain dicts and lists at run time (msgpack gives nothing else); the types let mypy check every key the
readers use against this one definition, so a renamed or misspelt field fails `make lint` instead of reading
None. The layout in words is in the package's docstring (`gradscape.tracer.wire`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypedDict

import numpy as np


class TraceFormatError(ValueError):
    """A trace (from the wire or a file) is malformed; the message names what is wrong."""


class WireArray(TypedDict):
    dtype: str
    shape: list[int]
    data: bytes


class _WireTensorBase(TypedDict):
    shape: list[int]
    dtype: str
    stats: list[float]  # STAT_NAMES order
    view: str
    device: str


class WireTensor(_WireTensorBase, total=False):
    """A tensor's summary. `thumb` and `values` are present on the wire and in a step read whole
    from the store; the store's graph form (`TraceStore.read_graph`) leaves them out."""
    thumb: WireArray | None
    values: WireArray | None


TensorNumpy = tuple[np.ndarray | None, np.ndarray | None]  # a tensor's (thumbnail, values) as arrays, off the wire


class TensorArrays(TypedDict):
    """A tensor's arrays alone: how the store keeps them, apart from the graph, so a view that
    needs one node's heatmaps reads only those (`TraceStore.read_arrays`)."""
    thumb: WireArray | None
    values: WireArray | None


TensorRefs = list[int | None]  # positions in WireStep["tensors"], None for a slot without a gradient


class WireRun(NamedTuple):
    """One run of a node (a node runs once per backward pass that reaches it). On the wire a run is
    the list `[pass, order, go, gi, t]`; read it with `node_runs`, never by position."""
    pass_index: int
    order: int
    go: TensorRefs
    gi: TensorRefs | None
    time_us: float | None


class WireNode(TypedDict):
    id: int
    name: str
    kind: str
    module: str | None
    param: str | None
    source: str | None
    schema: str | None
    order: int | None
    labels: list[str]
    args: list[str]
    in_shapes: list[list[int] | None]
    out_shapes: list[list[int] | None]
    out_dtypes: list[str | None]
    gi: TensorRefs | None  # ∂L/∂inputs, sent on (None when the node's hook did not see them)
    go: TensorRefs | None  # ∂L/∂outputs, arriving
    t: float | None
    runs: list[list[Any]]  # each a WireRun's fields, in order


# "in" is a Python keyword, hence the functional form
WireCall = TypedDict("WireCall", {"gi": TensorRefs, "go": TensorRefs, "in": list[int | None],
                                  "out": list[int | None], "last": int | None})


class WireModule(TypedDict):
    type: str
    params: list[str]
    calls: list[WireCall]


class WirePass(TypedDict):
    index: int
    api: str
    roots: list[int]
    root_grads: TensorRefs
    retain_graph: bool
    create_graph: bool
    start: int
    end: int


class WireProblem(TypedDict):
    kind: str
    message: str
    node: int | None
    param: str | None
    source: str | None


class WireOptimizerStep(TypedDict):
    """One `OptimizerStep` (tracer/_model.py): an optimizer step the monitor saw in the step."""
    optimizer: str
    params: list[str]
    lr: list[float]
    scale: float | None
    skipped: bool
    grad_norm: float | None
    grad_norm_before_clip: float | None


class WireStep(TypedDict):
    v: int
    run: str
    step: int
    error: str | None
    meta: dict[str, Any]
    nodes: list[WireNode]
    edges: list[list[int]]  # [src, dst, slot]
    modules: dict[str, WireModule]
    params: dict[str, int | None]
    passes: list[WirePass]
    execution: list[list[int]]  # [node id, run index]
    tensors: list[WireTensor]
    problems: list[WireProblem]
    not_in_step: list[str]  # parameter names
    rank: int | None
    world_size: int | None
    trigger: str | None  # the monitor: why an unscheduled step was traced
    optimizer_steps: list[WireOptimizerStep]


def node_runs(node: WireNode) -> list[WireRun]:
    """A node's runs, named (the wire keeps each as a short list)."""
    return [WireRun(*r) for r in node.get("runs") or ()]
