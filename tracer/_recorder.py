"""Recording one traced step: graph walk, node hooks, and assembly of the `StepTrace`.

NOTE [Hook lifetime]
    Node hooks are installed on the graph of each backward when it starts (see NOTE [Source lines]
    in `tracer._attrib` for how the start is seen) and removed when the step ends, also when it
    raises. The recorder holds strong references to the nodes for the step only (node wrappers are
    not weak-referenceable, and `id()` is recycled once a graph is freed), and drops them at the end
    so the graph can be freed. Nothing is written on the user's tensors, modules or nodes.

NOTE [Transforms]
    Inside a torch.func transform (grad, vjp, jacrev, vmap, ...) the tensors a backward sees are the
    transform's wrappers: they have no memory of their own to summarise, and their graph belongs to
    the transform. Such a backward runs exactly as it would untraced; the step notes why in
    `st.meta["notes"]` and the Tracer warns once. The forward around it is attributed as usual, and
    an ordinary backward in the same step is traced.

NOTE [Parameter gradients]: see `StepRecorder._params_after_pass`.

The recorder is written in parts, each in a module of its own: the graph walk (`_walk`), the node
hooks (`_hooks`), module-level gradients (`_modsums`) and assembly (`_assemble`); `StepRecorder`
joins them and handles the step's lifecycle and the start of each backward.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer._assemble import AssembleMixin, StructureCache
from gradscape.tracer._attrib import ForwardRecorder, ModuleCallRecord
from gradscape.tracer._breakpoints import breaker
from gradscape.tracer._hooks import HooksMixin, _now
from gradscape.tracer._model import BackwardPass, TensorTrace
from gradscape.tracer._modsums import ModuleSumsMixin
from gradscape.tracer._problems import StepProblems, root_values
from gradscape.tracer._summary import Summariser
from gradscape.tracer._walk import WalkMixin, _Rec

log = logging.getLogger(__name__)

__all__ = ["StepRecorder", "StructureCache"]


def _dtensor_type() -> Any:
    """torch.distributed's DTensor class, or None where torch.distributed is not built."""
    try:
        from torch.distributed.tensor import DTensor
    except Exception:
        return None
    return DTensor


def _dist_initialized() -> bool:
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized())


_functorch_stack = _compat.functorch_stack


def _in_functorch() -> bool:
    """True inside a torch.func transform (grad, vjp, jacrev, vmap, ...)."""
    return _functorch_stack() is not None


class StepRecorder(WalkMixin, HooksMixin, ModuleSumsMixin, AssembleMixin):
    """Everything about one traced step that needs live torch objects; `finish()` returns the
    plain `StepTrace` and lets go of them."""

    def __init__(self, run: str, step: int, model: Any, summariser: Summariser,
                 statics: StructureCache | None = None, warned: set[str] | None = None) -> None:
        self.run, self.step = run, step
        self.warned = warned if warned is not None else set()
        self.summ = summariser
        self.statics = statics if statics is not None else StructureCache()
        self.module_names: dict[Any, str] = {}
        self.module_types: dict[str, str] = {}
        self.module_params: dict[str, list[str]] = {}
        self.param_names: dict[Any, str] = {}
        self.unsharded_names: dict[Any, str] = {}  # FSDP2's per-forward copies → their parameter's name
        self._param_by_name: dict[str, Any] = {}
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
        self._param_trace: dict[str, TensorTrace] = {}
        # parameter → (summary, identity) of what last arrived at it in the running pass (_note_param)
        self._arrived: dict[str, tuple[TensorTrace | None, tuple[Any, ...] | None]] = {}
        self._distributed = _dist_initialized()
        self._warned_unreadable = False
        self.notes: list[str] = []  # what this step could not trace, and why (st.meta["notes"])
        self._calls: list[ModuleCallRecord] = []
        self._module_acc: dict[tuple[int, int], torch.Tensor] = {}
        self._hidden: dict[Any, str] = {}
        # (child id, input_nr) → the (node id, slot) pairs that send to it, built by the walk
        self._index: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._last_end: dict[int, int] = {}  # engine thread → when our last hook on it returned (ns)
        self._pass_t0 = 0
        self.breaker = breaker(run)  # breakpoints: see NOTE [Breakpoints] in tracer._breakpoints
        self.problems = StepProblems(self.statics)  # the problem finder (tracer/_problems.py)
        self.forward.on_detach = self.problems.note_detach  # the problem finder: where graphs are cut
        self.forward.on_no_grad = self.problems.note_no_grad
        # FSDP2 (`fully_shard`): the parameters are DTensor shards (NOTE [Unsharded parameters]); the
        # DTensor class then, else None, and only then the forward hook that names the unsharded copies
        dtensor = _dtensor_type() if self._distributed else None
        self._dtensor = dtensor if dtensor is not None and any(
            isinstance(p, dtensor) for p in self._param_by_name.values()) else None
        if self._dtensor is not None:
            self.forward.on_module_out = self._name_unsharded

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
                self._param_by_name.setdefault(pnames[p], p)
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
        if _in_functorch():  # NOTE [Transforms]
            self._note_once("a backward inside a torch.func transform (grad, vjp, jacrev, vmap) runs untraced: "
                            "its tensors are the transform's wrappers, whose memory cannot be read")
            return func(*args, **kwargs)
        roots, retain, create = self._roots_of(api, args, kwargs)
        try:
            root_ids = [self._walk_from(node) for node, _ in roots]
            index = self._pass_index
            self._pass_index += 1
            bp = BackwardPass(index=index, api=api, roots=root_ids, root_grads=[],
                              retain_graph=bool(retain), create_graph=bool(create), start=len(self.execution))
            self.passes.append(bp)
            self._plan_module_sums()
            self._watch_hidden_params()
            self.problems.at_backward(self.recs, root_ids, root_values(api, args, kwargs), index)  # problem finder
        except Exception as exc:  # never let the tracer break the user's backward
            log.warning("gradscape: could not instrument this backward (%s); it runs untraced", exc)
            return func(*args, **kwargs)
        result: Any = None
        try:
            self._pass_t0 = _now()
            result = func(*args, **kwargs)
            return result
        finally:
            bp.end = len(self.execution)
            for (_node, nr), rid in zip(roots, root_ids):
                runs = [r for r in self.recs[rid].runs if r.pass_index == index]
                bp.root_grads.append(runs[0].grad_outputs[nr] if runs and nr < len(runs[0].grad_outputs)
                                     else None)
            try:
                self._params_after_pass(api, args, kwargs, result)
            except Exception as exc:  # never let the tracer break the user's backward
                log.warning("gradscape: could not read the parameters' gradients after a backward: %s", exc)

    def _params_after_pass(self, api: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        """NOTE [Parameter gradients]: `st.params[name]` is the gradient the optimizer will see: the
        parameter's `.grad` when the step's last backward returned (so accumulated over micro-batches,
        and all-reduced under DistributedDataParallel, whose reducer writes `.grad` before the backward
        returns), or what `torch.autograd.grad` returned for it. `.grad` is read when each pass ends,
        for the parameters a gradient arrived at in that pass; clipping or an optimizer step later in
        the block changes nothing here. What arrived at each AccumulateGrad node in each pass stays in
        that node's runs. When `.grad` is the very tensor that arrived (the usual single backward after
        `zero_grad()`), the arrival's summary is taken as it is: no second pass over the gradient."""
        if api == "autograd.grad":
            if result is None:
                return
            inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
            if isinstance(inputs, (torch.Tensor, torch.autograd.graph.GradientEdge)):
                inputs = (inputs,)
            for t, g in zip(inputs or (), result):
                name = self.param_names.get(t) if isinstance(t, torch.Tensor) else None
                if name is not None and isinstance(g, torch.Tensor):
                    self._param_trace[name] = self.summ.summarise(g)
            return
        arrived, self._arrived = self._arrived, {}
        dtensor = self._dtensor
        for name, (tr, key) in arrived.items():
            p = self._param_by_name.get(name)
            g = None if p is None else p.grad
            if g is None or (dtensor is not None and isinstance(g, dtensor)):
                continue  # a shard (FSDP2): `_sharded_params` reads it without touching the other ranks
            if (tr is not None and key is not None and not self._distributed
                    and getattr(p, "_post_accumulate_grad_hooks", None) is None and g.layout == torch.strided
                    and key == (g.data_ptr(), g.shape, g.stride(), g.dtype)):
                self._param_trace[name] = tr
            else:
                self._param_trace[name] = self.summ.summarise(g)
        if dtensor is not None:
            self._sharded_params(dtensor)

    def _name_unsharded(self, mod: Any, name: str) -> None:
        """NOTE [Unsharded parameters]: FSDP2 (`fully_shard`) swaps each parameter for an unsharded
        copy in the module's `_parameters` for the forward, and the graph's AccumulateGrad nodes hold
        those copies, which `param_names` (built from the sharded parameters) does not know. The
        global forward hook that calls this runs before the module's own hooks, so before FSDP2 puts
        the shards back: what the module holds now is the copy, named after the parameter it stands for."""
        prefix = "" if name == "<root>" else name + "."
        for pname, p in mod._parameters.items():
            if p is not None and p not in self.param_names:
                self.unsharded_names[p] = prefix + pname

    def _sharded_params(self, dtensor: Any) -> None:
        """FSDP2 (`fully_shard`): the parameters are DTensor shards, and gradients arrive at the unsharded
        copies it makes for each forward (named after their parameter: NOTE [Unsharded parameters]).
        After the backward, a parameter's `.grad` is this rank's shard of the reduced gradient: what its
        optimizer steps with, kept as `st.params[name]` (the local shard, in the shard's own shape; an
        op on the DTensor itself could start a collective)."""
        for name, p in self._param_by_name.items():
            g = p.grad
            if isinstance(g, dtensor):
                self._param_trace[name] = self.summ.summarise(g.to_local())

    def _note_once(self, why: str) -> None:
        """Keep the reason something of this step went untraced in `st.meta["notes"]`, and warn about
        it once per `Tracer` (`warned`, shared by its steps)."""
        if why not in self.notes:
            self.notes.append(why)
        if why not in self.warned:
            self.warned.add(why)
            warnings.warn(f"gradscape: step {self.step}: {why}", RuntimeWarning, stacklevel=2)

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
