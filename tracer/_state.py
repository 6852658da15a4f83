"""The state one traced step's recorder keeps, shared by the parts of `StepRecorder` that live in
their own modules (`_walk`, `_hooks`, `_modsums`, `_assemble`): attribute and method declarations
only, for the type checker."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from gradscape.tracer._model import BackwardPass, StepTrace, TensorTrace
from gradscape.tracer._summary import Summariser

if TYPE_CHECKING:
    from gradscape.tracer._assemble import StructureCache
    from gradscape.tracer._attrib import ForwardRecorder, ModuleCallRecord
    from gradscape.tracer._walk import _Rec


class RecorderState:
    run: str
    step: int
    summ: Summariser
    statics: StructureCache
    module_names: dict[Any, str]
    module_types: dict[str, str]
    module_params: dict[str, list[str]]
    param_names: dict[Any, str]
    unsharded_names: dict[Any, str]
    forward: ForwardRecorder
    recs: list[_Rec]
    ids: dict[Any, int]
    passes: list[BackwardPass]
    execution: list[tuple[int, int]]
    _handles: list[Any]
    _pending: dict[tuple[int, int], tuple[tuple[Any, ...], TensorTrace]]
    _summarise: Callable[[torch.Tensor, TensorTrace | None], TensorTrace]
    _pass_index: int
    _param_trace: dict[str, TensorTrace]
    _param_by_name: dict[str, Any]
    _arrived: dict[str, tuple[TensorTrace | None, tuple[Any, ...] | None]]
    _distributed: bool
    _warned_unreadable: bool
    notes: list[str]
    warned: set[str]
    _calls: list[ModuleCallRecord]
    _module_acc: dict[tuple[int, int], torch.Tensor]
    _hidden: dict[Any, str]
    _index: dict[tuple[int, int], list[tuple[int, int]]]
    _last_end: dict[int, int]
    _pass_t0: int
    breaker: Any  # tracer._breakpoints.Breaker
    problems: Any  # tracer._problems.StepProblems
    # methods, each defined in one of the parts
    stop_hooks: Callable[[], None]
    _make_acc: Callable[[_Rec], Any]
    _make_post: Callable[[_Rec], Any]
    _make_hidden_pre: Callable[[str], Any]
    _module_sums: Callable[[], dict[tuple[int, int], TensorTrace]]
    _module_traces: Callable[[StepTrace, dict[tuple[int, int], TensorTrace]], dict[str, Any]]
    _note_once: Callable[[str], None]
    _add_to_module_sum: Callable[[tuple[int, int], torch.Tensor], None]
