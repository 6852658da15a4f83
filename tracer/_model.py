"""The data model of a recorded step (`StepTrace` and its parts): what the recorder makes and what users,
`gradscape.load` and the tests read. It is not what travels on: a sink hands a step on in its wire form
(tracer/wire/: its column document, whichever recorder made it), which the store keeps and the page reads;
the page never rebuilds a `StepTrace` (app/view/step_fields.py).

A `StepTrace` is complete when the `with tr.step(i)` block exits. Everything in it is plain Python
and numpy (no torch objects), so it can be serialised (see `tracer.wire`) and compared.

NOTE [Read-only steps]
    A `StepTrace` is what a step recorded, so its fields cannot be assigned: `st.nodes = ...` raises
    `dataclasses.FrozenInstanceError` (an `AttributeError`) naming the field. A changed copy is
    `dataclasses.replace(st, ...)`. The recorders and the readers of the wire forms, which build one
    field at a time, write through `fill`, the one way in. Its nodes are read-only too: a recorded
    step's `NodeTrace` is made from the step's tables when read (NOTE [Step tables] in
    tracer/record/tables.py), and the tables are what is written, so a node changed in place would
    show one thing and store another; a changed node is `dataclasses.replace(node, ...)`, in a changed
    step whose nodes are then a list. The lists and maps inside are the recorder's own and are not
    copied on the way out.

NOTE [Slot order]
    `NodeTrace.grad_inputs[j]` is what the node sent along `next_functions[j]`: the gradient w.r.t.
    its forward input j (the j-th differentiable argument of the forward op). `grad_outputs[i]` is
    what arrived for its forward output i, already summed over every consumer by the engine. Both
    lists follow PyTorch's Node-hook order, and `StepTrace.edges` index `grad_inputs` by `slot`.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import MutableMapping, MutableSequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

STAT_NAMES = ("min", "max", "mean", "std", "norm", "nan", "inf", "zeros")
"""The keys of `TensorTrace.stats`: `min max mean std norm` over the finite elements, and the counts of NaN,
infinite and zero elements."""
# A step's HTML (`StepTrace._repr_html_`, `StepTrace.to_html`) is drawn by app/export/, a layer above this
# one (docs/architecture.md): gradscape/__init__.py puts its two functions here, "inline" (st -> str) and
# "file" (st, path -> Path), when the package is imported, which any import of this module does first.
HTML_RENDERERS: dict[str, Any] = {}


@dataclass(slots=True)
class TensorTrace:
    """A gradient tensor, summarised: shape, dtype, statistics, a 2-D thumbnail, and values if kept.

    `stats` holds `min max mean std norm` (over the finite elements) and the counts `nan inf zeros`.
    `thumb` is a float32 array of at most `thumb`×`thumb`; `thumb_view` says which 2-D view of the
    tensor it shows (see `tracer.wire.thumbnail_view`). `values` is the full array when the
    tracer runs with `tensors="full"`, else None. `shape` and `dtype` are the gradient's (`"float32"`),
    `device` where it lived (`"cpu"`, `"cuda:0"`).
    """

    shape: tuple[int, ...]
    dtype: str
    stats: dict[str, float] = field(default_factory=dict)
    thumb: np.ndarray | None = None
    thumb_view: str = ""
    values: np.ndarray | None = None
    device: str = "cpu"

    @property
    def numel(self) -> int:
        """The number of elements of the gradient (the product of `shape`)."""
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(slots=True)
class NodeRun:
    """One execution of a node (a node runs again under `retain_graph=True` or a second pass).

    `pass_index`: the `BackwardPass` it ran in; `order`: its position in the step's execution order;
    `grad_outputs` / `grad_inputs`: what arrived and what it sent on in this run; `time_us`: its time on its
    engine thread since the previous node there finished (None for AccumulateGrad).
    """

    pass_index: int
    order: int
    grad_outputs: list[TensorTrace | None]
    grad_inputs: list[TensorTrace | None] | None
    time_us: float | None = None


@dataclass(slots=True, frozen=True)
class NodeTrace:
    """One autograd graph node (`grad_fn`), with the gradients it saw in this step.

    `id` is issued by the tracer (walk order, deterministic for the same model and inputs), never
    `id()`. `order` is the position of its first execution in the step's backward execution order,
    None if it did not run. See NOTE [Slot order] for `grad_inputs` / `grad_outputs`.

    - `name`: the node's class (`"AddmmBackward0"`, `"torch::autograd::AccumulateGrad"`); `kind`: `op`,
      `leaf`, `param`, `compiled`, `checkpoint`, `custom`, `hook` or `root`.
    - `module`: the qualified name of the module whose forward made it, or None; `param`: for a parameter's
      AccumulateGrad, the parameter's qualified name; `source`: `"file.py:LINE"` of the op, or None;
      `schema`: the op's schema, when known.
    - `grad_outputs[i]`: ∂L/∂(forward output i), what arrived (a `TensorTrace`, or None);
      `grad_inputs[j]`: ∂L/∂(forward input j) as this node computed it, what it sent on; each list None
      when the node did not run.
    - `input_labels[j]`: what slot j is, for a person (`"mat2 → fc2.weight (transposed)"`); `input_args[j]`:
      the forward op's argument name (`"mat2"`); `input_shapes`, `output_shapes`, `output_dtypes`: of the
      forward's inputs and outputs.
    - `time_us`: its time on its engine thread since the previous node there finished (None for
      AccumulateGrad); `runs`: every execution (`NodeRun`), e.g. under `retain_graph=True`.

    Read-only, as the step is (NOTE [Read-only steps]).
    """

    id: int
    name: str
    kind: str = "op"  # op | leaf | param | compiled | checkpoint | custom | hook | root
    module: str | None = None
    param: str | None = None
    source: str | None = None
    schema: str | None = None
    order: int | None = None
    input_labels: list[str] = field(default_factory=list)
    input_args: list[str] = field(default_factory=list)
    input_shapes: list[tuple[int, ...] | None] = field(default_factory=list)
    output_shapes: list[tuple[int, ...] | None] = field(default_factory=list)
    output_dtypes: list[str | None] = field(default_factory=list)
    grad_inputs: list[TensorTrace | None] | None = None
    grad_outputs: list[TensorTrace | None] | None = None
    time_us: float | None = None
    runs: list[NodeRun] = field(default_factory=list)


@dataclass(slots=True)
class ModuleCall:
    """One call of a module's forward: full-backward-hook semantics, without full hooks.

    `grad_input[k]`: ∂L/∂(k-th positional tensor argument) through this module only (None for
    non-tensors and inputs that need no grad). `grad_output[k]`: ∂L/∂(k-th tensor output).
    `input_nodes` / `output_nodes`: the node ids where its inputs enter and its outputs leave the graph;
    `last_op`: the id of the node of its last op, whose `grad_inputs` the deprecated
    `register_backward_hook` reported.
    """

    grad_input: list[TensorTrace | None]
    grad_output: list[TensorTrace | None]
    input_nodes: list[int | None] = field(default_factory=list)
    output_nodes: list[int | None] = field(default_factory=list)
    last_op: int | None = None


@dataclass(slots=True)
class ModuleTrace:
    """A module of the user's model. `grad_input`/`grad_output` are those of its first call;
    every call (a module may be called more than once per step) is in `calls`. `name`: its qualified
    name (`"<root>"` for the model itself); `type`: its class name (`"Linear"`); `params`: the qualified
    names of its own parameters."""

    name: str
    type: str
    calls: list[ModuleCall] = field(default_factory=list)
    params: list[str] = field(default_factory=list)

    @property
    def grad_input(self) -> list[TensorTrace | None]:
        """∂L/∂(each positional tensor input) of its first call, as `register_full_backward_hook` gives."""
        return self.calls[0].grad_input if self.calls else []

    @property
    def grad_output(self) -> list[TensorTrace | None]:
        """∂L/∂(each tensor output) of its first call, as `register_full_backward_hook` gives."""
        return self.calls[0].grad_output if self.calls else []


@dataclass(slots=True)
class BackwardPass:
    """One call of `backward` / `autograd.grad` inside the step.

    `index`: its position among the step's passes; `api`: `"Tensor.backward"`, `"autograd.backward"` or
    `"autograd.grad"`; `roots`: the node ids it started from; `root_grads`: the gradient supplied at each
    root (`gradient=` / `grad_outputs=`, or the implicit 1 of a scalar loss); `retain_graph`,
    `create_graph`: as it was called; `start` / `end`: its slice of `StepTrace.execution`.
    """

    index: int
    api: str  # "Tensor.backward" | "autograd.backward" | "autograd.grad"
    roots: list[int]
    root_grads: MutableSequence[TensorTrace | None]
    retain_graph: bool = False
    create_graph: bool = False
    start: int = 0  # index into StepTrace.execution
    end: int = 0


@dataclass(slots=True)
class Problem:
    """Something the problem finder saw in a step, for a person to look at first.

    `kind`: one of `nonfinite_forward` (the first NaN/Inf value of the forward: an op, or a parameter or
    input that already held it), `nonfinite_backward` (a backward node that made a non-finite gradient
    from finite arriving ones), `nonfinite_loss` (a backward root that is NaN/Inf), `no_grad` (a
    parameter that requires grad but got none), `exploding`, `vanishing`, `dead`. `node` is a node id
    or None, `param` a parameter name or None, `source` a `file.py:LINE` or None, `message` one
    sentence a person understands.
    """

    kind: str
    message: str
    node: int | None = None
    param: str | None = None
    source: str | None = None


@dataclass(slots=True)
class OptimizerStep:
    """One `optimizer.step()` run inside a step block, or one that GradScaler skipped (the monitor,
    `tracer/monitor/`). `optimizer`: its name ("SGD", a second Adam "Adam#1"); `params`: the names of
    the parameters it holds; `lr`: the learning rate of each of its param groups; `scale`: GradScaler's
    scale the gradients were produced at, None without GradScaler; `skipped`: GradScaler skipped the step
    (inf/NaN gradients); `grad_norm`: total 2-norm of the gradients it stepped with (unscaled, after
    clipping; None when skipped); `grad_norm_before_clip`: total 2-norm, unscaled, of those gradients as
    the backward left them (what `clip_grad_norm_` returns when the loop clips). `grads`: parameter name →
    `TensorTrace` of the gradient this very step used, in a step the tracer recorded (not kept in the trace
    file): when one optimizer steps twice in a block, `st.params` holds the last step's and each record
    its own."""

    optimizer: str
    params: list[str] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    scale: float | None = None
    skipped: bool = False
    grad_norm: float | None = None
    grad_norm_before_clip: float | None = None
    grads: MutableMapping[str, TensorTrace] = field(default_factory=dict, compare=False, repr=False)


def fill(st: StepTrace, **fields: Any) -> None:
    """Set fields of a `StepTrace` that is being built (a recorder's, a reader's): NOTE [Read-only steps]."""
    deque(map(object.__setattr__, repeat(st), fields.keys(), fields.values()), maxlen=0)  # (C-level passes)


@dataclass(slots=True, frozen=True)
class StepTrace:
    """Everything recorded for one traced training step, complete when the `with tr.step(i)` block exits.

    - `run`, `step`: the run's name and the step's index; `rank`, `world_size`: from `torch.distributed`
      when it is initialised, else None.
    - `nodes`: every autograd node (`NodeTrace`; `nodes[k].id == k`); `edges`: `(src, dst, slot)`:
      `src.grad_inputs[slot]` flows to `dst`; `execution`: `(node id, run index)` in the order autograd
      ran them.
    - `modules`: qualified name → `ModuleTrace` (`grad_input` / `grad_output` with full-hook meaning);
      `params`: qualified name → `TensorTrace`, the gradient the optimizer stepped with (or `p.grad` when
      the block's last backward returned; see the docs' Tracer page), in the model's order of its parameters.
    - `passes`: each `backward` / `autograd.grad` call (`BackwardPass`); `optimizer_steps`: each
      `optimizer.step()` in the block (`OptimizerStep`).
    - `problems`: what the problem finder saw (`Problem`), root cause first; `not_in_step`: parameters
      without a gradient whose module took no part in the step's forward (none was expected).
    - `trigger`: None for a step `every` scheduled, else why the monitor traced it (`"nonfinite"`,
      `"loss_spike"`, `"grad_spike"`, `"amp_skipped"`); `error`: the exception the block raised, if any;
      `meta`: the rest (`"notes"`: what could not be traced and why, `"recorder"`, `"trigger"`, ...).

    Read-only: assigning a field raises (NOTE [Read-only steps]); `dataclasses.replace` makes a changed copy.
    """

    run: str
    step: int
    nodes: list[NodeTrace] = field(default_factory=list)
    edges: list[tuple[int, int, int]] = field(default_factory=list)
    modules: dict[str, ModuleTrace] = field(default_factory=dict)
    params: MutableMapping[str, TensorTrace] = field(default_factory=dict)
    passes: list[BackwardPass] = field(default_factory=list)
    execution: list[tuple[int, int]] = field(default_factory=list)  # (node id, run index)
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    problems: list[Problem] = field(default_factory=list)  # root cause first
    # parameters that need a gradient and got none because their module took no part in this step's
    # forward (layer-local training, an unused branch): no gradient was expected, so no problem
    not_in_step: list[str] = field(default_factory=list)
    rank: int | None = None  # torch.distributed rank, None outside torch.distributed
    world_size: int | None = None
    trigger: str | None = None  # None: scheduled by `every`; else why it was traced (tracer/monitor/triggers.py)
    optimizer_steps: list[OptimizerStep] = field(default_factory=list)  # in the order they ran

    def node(self, node_id: int) -> NodeTrace:
        """The node with id `node_id` (`nodes[node_id]`)."""
        return self.nodes[node_id]

    def by_name(self, name: str) -> list[NodeTrace]:
        """Every node of that class name (`"AddmmBackward0"`), in id order."""
        return [n for n in self.nodes if n.name == name]

    @property
    def order(self) -> list[int]:
        """Node ids in the order autograd ran them (first execution of each)."""
        ran = [n for n in self.nodes if n.order is not None]
        return [n.id for n in sorted(ran, key=lambda n: n.order or 0)]

    def param_node(self, name: str) -> NodeTrace | None:
        """The AccumulateGrad node of the parameter `name` (what arrived there, each pass's run), or None."""
        param_ids = getattr(self.nodes, "param_ids", None)  # lazily made nodes: their parameter column
        if param_ids is not None:
            k = param_ids().get(name)
            return None if k is None else self.nodes[k]
        for n in self.nodes:
            if n.param == name:
                return n
        return None

    def summary(self) -> str:
        """A readable text summary (what `make run` prints before the UI exists)."""
        from gradscape.tracer.report import format_step

        return format_step(self)

    def nodes_table(self) -> Any:
        """The step's nodes as a `pyarrow.Table`, a row each (NOTE [Step tables for analysis] in frames.py)."""
        from gradscape.tracer.frames import nodes_table

        return nodes_table(self)

    def gradients_table(self) -> Any:
        """Every gradient slot of every node's runs as a `pyarrow.Table` (NOTE [Step tables for analysis])."""
        from gradscape.tracer.frames import gradients_table

        return gradients_table(self, STAT_NAMES)

    def params_table(self) -> Any:
        """The parameters' gradients as a `pyarrow.Table` (NOTE [Step tables for analysis])."""
        from gradscape.tracer.frames import params_table

        return params_table(self, STAT_NAMES)

    def __repr__(self) -> str:
        rank = "" if self.rank is None else f", rank={self.rank}"
        return (f"StepTrace(run={self.run!r}, step={self.step}{rank}, nodes={len(self.nodes)}, "
                f"edges={len(self.edges)}, problems={len(self.problems)})")

    def _repr_html_(self) -> str:
        """A notebook's display: the graph as SVG, the problems, the busiest nodes (app/export/inline.py)."""
        return str(HTML_RENDERERS["inline"](self))

    def to_html(self, path: str | os.PathLike[str]) -> Path:
        """Write one self-contained HTML file of this step, for any browser, from disk, with no server and
        no network (app/export/html.py); returns its path."""
        return Path(HTML_RENDERERS["file"](self, path))
