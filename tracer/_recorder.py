"""Recording one traced step: graph walk, node hooks, and assembly of the `StepTrace`.

NOTE [Hook lifetime]
    Node hooks are installed on the graph of each backward when it starts (see NOTE [Source lines]
    in `tracer._attrib` for how the start is seen) and removed when the step ends, also when it
    raises. The recorder holds strong references to the nodes for the step only (node wrappers are
    not weak-referenceable, and `id()` is recycled once a graph is freed), and drops them at the end
    so the graph can be freed. Nothing is written on the user's tensors, modules or nodes.

The recorder is written in parts, each in a module of its own: the graph walk (`_walk`), the node
hooks (`_hooks`), module-level gradients (`_modsums`) and assembly (`_assemble`); `StepRecorder`
joins them and handles the step's lifecycle and the start of each backward.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from tracer._assemble import AssembleMixin, StructureCache
from tracer._attrib import ForwardRecorder, ModuleCallRecord
from tracer._hooks import HooksMixin, _now
from tracer._model import BackwardPass, TensorTrace
from tracer._modsums import ModuleSumsMixin
from tracer._summary import Summariser
from tracer._walk import WalkMixin, _Rec

log = logging.getLogger(__name__)

__all__ = ["StepRecorder", "StructureCache"]


class StepRecorder(WalkMixin, HooksMixin, ModuleSumsMixin, AssembleMixin):
    """Everything about one traced step that needs live torch objects; `finish()` returns the
    plain `StepTrace` and lets go of them."""

    def __init__(self, run: str, step: int, model: Any, summariser: Summariser,
                 statics: StructureCache | None = None) -> None:
        self.run, self.step = run, step
        self.summ = summariser
        self.statics = statics if statics is not None else StructureCache()
        self.module_names: dict[Any, str] = {}
        self.module_types: dict[str, str] = {}
        self.module_params: dict[str, list[str]] = {}
        self.param_names: dict[Any, str] = {}
        if model is not None:
            self._index_model(model)
        self.forward = ForwardRecorder(self.module_names, self._on_backward)
        self.recs: list[_Rec] = []
        self.ids: dict[Any, int] = {}
        self.passes: list[BackwardPass] = []
        self.execution: list[tuple[int, int]] = []
        self._handles: list[Any] = []
        self._pending: dict[tuple[int, int], tuple[tuple[Any, ...], TensorTrace]] = {}
        self._summarise = summariser.summarise_no_grad  # hooks turn grad mode off once for all their tensors
        self._pass_index = 0
        self._param_sum: dict[str, torch.Tensor] = {}
        self._param_trace: dict[str, TensorTrace] = {}
        self._param_count: dict[str, int] = {}
        self._keep_param_copies = False
        self._calls: list[ModuleCallRecord] = []
        self._module_acc: dict[tuple[int, int], torch.Tensor] = {}
        self._hidden: dict[Any, str] = {}
        # (child id, input_nr) → the (node id, slot) pairs that send to it, built by the walk
        self._index: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._last_end: dict[int, int] = {}  # engine thread → when our last hook on it returned (ns)
        self._pass_t0 = 0

    def _index_model(self, model: Any) -> None:
        """Qualified names of modules and parameters, in one pre-order pass over `_modules` (what
        `named_modules(remove_duplicate=False)` walks, without its generators): a shared module or
        parameter keeps its first name, as `named_modules()` / `named_parameters()` give it."""
        names, types, params, pnames = self.module_names, self.module_types, self.module_params, self.param_names
        stack: list[tuple[str, Any]] = [("", model)]
        while stack:
            name, mod = stack.pop()
            first = mod not in names
            prefix = name + "." if name else ""
            plist: list[str] = []
            if first:
                qual = name or "<root>"
                names[mod] = qual
                types[qual] = type(mod).__name__
                params[qual] = plist
            for pname, p in mod._parameters.items():
                if p is None:
                    continue
                full = prefix + pname
                pnames.setdefault(p, full)
                if first:
                    plist.append(full)
            children = [(prefix + cname, child) for cname, child in mod._modules.items() if child is not None]
            stack.extend(reversed(children))

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.forward.start()

    def stop_hooks(self) -> None:
        """Remove every hook and mode of ours. Idempotent."""
        self.forward.stop()
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    # ------------------------------------------------------------------ backward entry
    def _on_backward(self, api: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        roots, retain, create = self._roots_of(api, args, kwargs)
        try:
            root_ids = [self._walk_from(node) for node, _ in roots]
            index = self._pass_index
            self._pass_index += 1
            self._keep_param_copies = self._keep_param_copies or bool(retain) or index > 0
            bp = BackwardPass(index=index, api=api, roots=root_ids, root_grads=[],
                              retain_graph=bool(retain), create_graph=bool(create), start=len(self.execution))
            self.passes.append(bp)
            self._plan_module_sums()
            self._watch_hidden_params()
        except Exception as exc:  # never let the tracer break the user's backward
            log.warning("gradscape: could not instrument this backward (%s); it runs untraced", exc)
            return func(*args, **kwargs)
        try:
            self._pass_t0 = _now()
            return func(*args, **kwargs)
        finally:
            bp.end = len(self.execution)
            for (_node, nr), rid in zip(roots, root_ids):
                runs = [r for r in self.recs[rid].runs if r.pass_index == index]
                bp.root_grads.append(runs[0].grad_outputs[nr] if runs and nr < len(runs[0].grad_outputs)
                                     else None)

    @staticmethod
    def _roots_of(api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[tuple[Any, int]],
                                                                                    Any, Any]:
        if api == "Tensor.backward":
            tensors: Any = [args[0]]
            retain = kwargs.get("retain_graph", args[2] if len(args) > 2 else None)
            create = kwargs.get("create_graph", args[3] if len(args) > 3 else False)
        else:
            first = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
            tensors = [first] if isinstance(first, (torch.Tensor, torch.autograd.graph.GradientEdge)) \
                else list(first or ())
            if api == "autograd.grad":
                retain = kwargs.get("retain_graph", args[3] if len(args) > 3 else None)
                create = kwargs.get("create_graph", args[4] if len(args) > 4 else False)
            else:
                retain = kwargs.get("retain_graph", args[2] if len(args) > 2 else None)
                create = kwargs.get("create_graph", args[3] if len(args) > 3 else False)
        if retain is None:
            retain = create
        roots: list[tuple[Any, int]] = []
        for t in tensors:
            if isinstance(t, torch.autograd.graph.GradientEdge):
                roots.append((t.node, t.output_nr))
            elif isinstance(t, torch.Tensor) and t.requires_grad:
                e = torch.autograd.graph.get_gradient_edge(t)
                roots.append((e.node, e.output_nr))
        return roots, retain, create
