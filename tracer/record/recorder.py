"""Recording one traced step: graph walk, node hooks, and assembly of the `StepTrace`.

NOTE [Hook lifetime]
    Node hooks are installed on the graph of each backward when it starts (see NOTE [Source lines]
    in tracer/record/forward.py for how the start is seen) and removed when the step ends, also when
    it raises: every handle of the step, the forward recorder's included, is held by the step's one
    `StepHandles` (tracer/record/handles.py), which removes them all in one place. The recorder
    holds strong references to the nodes for the step only (node wrappers are not
    weak-referenceable, and `id()` is recycled once a graph is freed), and drops them at the end so
    the graph can be freed. Nothing is written on the user's tensors, modules or nodes.

NOTE [Transforms]
    Inside a torch.func transform (grad, vjp, jacrev, vmap, ...) the tensors a backward sees are the
    transform's wrappers: they have no memory of their own to summarise, and their graph belongs to
    the transform. Such a backward runs exactly as it would untraced; the step notes why in
    `st.meta["notes"]` and the Tracer warns once. The forward around it is attributed as usual, and
    an ordinary backward in the same step is traced. Whether one is active is read from the thread's dispatch
    keys (`_compat.functorch_active`), not from functorch's interpreter stack: reading that stack makes
    functorch's thread state, which the autograd engine then copies on every later backward call of the thread,
    an untraced one's too (docs/costs.md has what that cost).

What a parameter's gradient is in a step: NOTE [Parameter gradients] in tracer/record/params.py.

`StepRecorder` owns the step's state and handles its lifecycle and the start of each backward. Its
parts are collaborators it makes and owns, each in a module of its own, each given what it reads:
the model's names (`ModelIndex`, model_index.py), the graph walk (`GraphWalk`, walk.py), the node
hooks (`NodeHooks`, node_hooks.py), every handle (`StepHandles`, handles.py), the parameters'
gradients (`ParamGradients`, params.py), module-level gradients (`ModuleSums`, module_sums.py), the
forward's attribution (`ForwardRecorder`, forward.py) and assembly (assemble.py, structure.py). The
debugger and the problem finder read the step through `StepView` (view.py).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer._model import BackwardPass, StepTrace, fill
from gradscape.tracer.collector import CollectorPause
from gradscape.tracer.record import patched_calls
from gradscape.tracer.record.assemble import edges_of, python_tables
from gradscape.tracer.record.call_thumbs import CallThumbs
from gradscape.tracer.record.carry import (
    BREAKPOINT_NEXT_STEP,
    NOT_CARRIED,
    SECOND_PASS,
    ForwardCarry,
    attribution,
    forward_key,
)
from gradscape.tracer.record.debug.breakpoints import breaker
from gradscape.tracer.record.debug.problems import StepProblems
from gradscape.tracer.record.forward import ForwardRecorder
from gradscape.tracer.record.handles import CallOnRemove, StepHandles
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.record.module_sums import ModuleSums
from gradscape.tracer.record.native_step import NativeStep
from gradscape.tracer.record.node_hooks import NodeHooks, now
from gradscape.tracer.record.params import ParamGradients
from gradscape.tracer.record.roots import backward_roots, root_values
from gradscape.tracer.record.structure import StructureCache
from gradscape.tracer.record.view import StepView
from gradscape.tracer.record.walk import GraphWalk
from gradscape.tracer.summary.summariser import Summariser

log = logging.getLogger(__name__)

__all__ = ["StepRecorder", "StructureCache"]

_in_functorch = _compat.functorch_active  # True inside a torch.func transform (grad, vjp, jacrev, vmap, ...)


def _after_step(*args: Any) -> Any:
    raise RuntimeError("gradscape: this step's recorder has finished")


class StepRecorder:
    """Everything about one traced step that needs live torch objects; `finish()` returns the
    plain `StepTrace` and lets go of them."""

    def __init__(self, run: str, step: int, model: Any, summariser: Summariser,
                 statics: StructureCache | None = None, warned: set[str] | None = None,
                 carry: ForwardCarry | None = None, recorder: str = "native") -> None:
        self.run, self.step = run, step
        # "native" (where it can: `python_why`), "python", or "python (why the native one is not used)": the
        # Tracer's choice (`Tracer(recorder=...)`); st.meta["recorder"] says which recorded the step
        self.recorder = recorder
        self.recorded_by = recorder
        self.carry = carry  # NOTE [Carried forwards] in tracer/record/carry.py (None: never carried)
        self.unwrapped = False  # a backward reached the recorder through the mode only, not the wrappers
        # carried and matched: the kept modules and sources, and how many nodes the matched backward calls walked
        self.kept: tuple[list[Any], list[Any], int] | None = None
        # recorded with the hooks and the mode: each backward call's key, module calls and marks as it began
        self.call_keys: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
        self.last_key = b""  # carried: the key of the last backward call (each call's key is chained to it)
        self.warned = warned if warned is not None else set()
        self.summ = summariser
        self.thumbs = CallThumbs(summariser)  # each backward call's thumbnail size
        self.statics = statics if statics is not None else StructureCache()
        self.model = model if isinstance(model, ModelIndex) else ModelIndex(model)  # (the Tracer's: NOTE [Index kept])
        self.forward = ForwardRecorder(self.model.module_names, self._on_backward)
        self.walk = GraphWalk(self.model)
        self.handles = StepHandles()  # every hook of the step (NOTE [Hook lifetime])
        self.params = ParamGradients(self.model, summariser)
        self.module_sums = ModuleSums(self.walk, self.forward)
        self.passes: list[BackwardPass] = []
        self.collector = CollectorPause()  # off from the first backward until the step is emitted (collector.py)
        self.notes: list[str] = []  # what this step could not trace, and why (st.meta["notes"])
        execution: list[tuple[int, int]] = []  # written by the node hooks, read by the view
        self.view = StepView(step, self.walk, execution, self.forward, summariser, self.model, self.statics)
        # breakpoints: see NOTE [Breakpoints] in tracer/record/debug/breakpoints.py
        self.hooks = NodeHooks(step, summariser, self.params, self.module_sums, breaker(run), self.view, execution)
        self.problems = StepProblems(self.statics)  # the problem finder (tracer/record/debug/problems.py)
        # the native recorder's part of the step (NOTE [Native recorder] in native.py), from its first backward
        self.native: NativeStep | None = None
        self.forward.on_detach = self.problems.note_detach  # the problem finder: where graphs are cut
        self.forward.on_no_grad = self.problems.note_no_grad
        # FSDP2 (`fully_shard`): only then the forward hook that names the unsharded copies
        if self.params.dtensor is not None:
            self.forward.on_module_out = self.model.name_unsharded

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Install the forward's hooks and mode (removed with the step's other handles)."""
        self.handles.add(CallOnRemove(self.forward.stop))
        self.collector.pause()  # NOTE [Garbage collector] in tracer/collector.py; resumed by the step's end
        carry = self.carry
        self.forward.start(carried=carry is not None and carry.ready and self._native_ok()
                           and self.params.dtensor is None)

    def finish(self, error: BaseException | None, st: StepTrace) -> StepTrace:
        """Remove every hook, fetch summaries, and fill `st`, the `StepTrace` the step's block handed out (no second
        step is made and copied into it). Drops every torch reference."""
        self.handles.remove()
        native = self.native
        self.thumbs.first_size(native)  # (NOTE [Repeated calls' thumbnails] in call_thumbs.py)
        self.settle_params()
        if native is not None:
            self.module_sums.sums = native.graph.sums()
        module_grad_sums = self.module_sums.summaries(self.summ, native)
        self.summ.finalize()
        fill(st, **self._graph_fields(), passes=self.passes, params=self.params.in_model_order())
        fill(st, **self._closing_fields(st, module_grad_sums, error))
        fill(st, problems=self.problems.finish(st, self.view, self.params.unmade, self.params.held))  # (debug/)
        if self.carry is not None and any(p.kind == "no_grad" for p in st.problems):
            self.carry.reset()  # its reason may name the line of a detach: only the mode sees those
        self._release()
        return st

    def _graph_fields(self) -> dict[str, Any]:
        """The step's nodes, edges and execution order, from either recorder (and the parameters resolved)."""
        native = self.native
        if native is not None:
            keys = self.call_keys
            keep = None if self.unwrapped or not self.passes or len(keys[0]) != len(self.passes) else keys
            attributed = attribution(self.carry, native.graph, self.forward, self.kept, keep)
            nodes, edges, ran = native.assemble(attributed, self.statics)
            self.params.resolve(native)
            tensors = native.tables.tensors  # type: ignore[union-attr]
            self.summ.thumb_cells += tensors.cells_bound  # a bound: the budget counts exactly past it
            self.summ.nonfinite = self.summ.nonfinite or tensors.nonfinite()
            return {"nodes": nodes, "edges": edges, "execution": ran}
        if self.carry is not None:  # no key without the native graph: the next step runs with the mode
            self.carry.reset()
            if self.passes and self.forward.carried:
                self._note(NOT_CARRIED)
        records, execution = self.walk.records, self.hooks.execution
        for pos, (rid, k) in enumerate(execution):
            records[rid].runs[k].order = pos
        return {"nodes": python_tables(records, execution, self.forward, self.view.slot_statics),
                "edges": edges_of(records), "execution": list(execution)}

    def _closing_fields(self, st: StepTrace, module_grad_sums: Any, error: BaseException | None) -> dict[str, Any]:
        """The step's modules, meta, ranks and error (filled at once: each `fill` of a read-only step is a call)."""
        if not self.passes and not self.notes and error is None:
            self._note_once("no backward ran inside the traced step, so its trace is empty (call backward() "
                            "or torch.autograd.grad() inside the `with tr.step(i)` block)")
        meta: dict[str, Any] = {"torch": torch.__version__, "nodes": len(st.nodes), "passes": len(self.passes)}
        if self.passes:  # which recorder recorded the node hooks, and why not the native one (NOTE [Native recorder])
            meta["recorder"] = self.recorded_by
        if self.notes:
            meta["notes"] = list(self.notes)
        out: dict[str, Any] = {"modules": self.module_sums.module_traces(st, module_grad_sums, self.model),
                               "meta": meta}
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            out.update(rank=dist.get_rank(), world_size=dist.get_world_size())
        if error is not None:
            out["error"] = f"{type(error).__name__}: {error}"
        return out

    def _release(self) -> None:
        if self.native is not None:
            self.native.release()
        self.walk.release()
        self.hooks.release()
        self.params.arrived, self.params.pending = {}, {}
        self.module_sums.release()
        self.forward.calls = []
        self.forward.on_backward = _after_step  # the recorder ↔ forward recorder cycle, broken: freed by refcount
        self.model.release()

    # ------------------------------------------------------------------ backward entry
    def _on_backward(self, api: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _in_functorch():  # NOTE [Transforms]
            self._note_once("a backward inside a torch.func transform (grad, vjp, jacrev, vmap) runs untraced: "
                            "its tensors are the transform's wrappers, whose memory cannot be read")
            return func(*args, **kwargs)
        roots, retain, create = backward_roots(api, args, kwargs)
        self.unwrapped = self.unwrapped or not patched_calls.handling()
        self.collector.pause()  # (again: a no-op unless the user switched it on inside the block)
        try:
            bp = self._start_pass(api, roots, retain, create, root_values(api, args, kwargs))
        except Exception as exc:  # never let the tracer break the user's backward
            log.warning("gradscape: could not instrument this backward (%s); it runs untraced", exc)
            return func(*args, **kwargs)
        result: Any = None
        native, arrivals = self.native, None
        try:
            self.hooks.pass_t0 = now()
            if native is not None:
                native.begin(bp)
            result = func(*args, **kwargs)
            return result
        finally:
            if native is not None:
                arrivals = native.end_pass(bp, roots)
            else:
                bp.end = len(self.hooks.execution)
                for (_node, nr), rid in zip(roots, bp.roots):
                    runs = [r for r in self.walk.records[rid].runs if r.pass_index == bp.index]
                    bp.root_grads.append(runs[0].grad_outputs[nr] if runs and nr < len(runs[0].grad_outputs)
                                         else None)
            try:
                self.params.after_pass(api, args, kwargs, result, arrivals)
            except Exception as exc:  # never let the tracer break the user's backward
                log.warning("gradscape: could not read the parameters' gradients after a backward: %s", exc)

    def _start_pass(self, api: str, roots: list[tuple[Any, int]], retain: Any, create: Any,
                    values: list[torch.Tensor | None]) -> BackwardPass:
        """Walk the graph from the pass's roots, hook what is new, and plan the module sums."""
        index = len(self.passes)
        why = self._python_why() if index == 0 else ""
        if why and self.forward.carried and self.hooks.breaker.armed and not self.summ.keep_values:
            # a breakpoint set while this step's forward ran carried (which only the native recorder attributes:
            # NOTE [Carried forwards] in carry.py) takes effect from the next step, whose forward is recorded
            why = None
            self._note(BREAKPOINT_NEXT_STEP)
        if why:
            self.recorded_by = f"python ({why})"
        if index == 0 and why is None:
            self.native = NativeStep(self.model, self.summ, self.summ.thumb)
            self.handles.add(CallOnRemove(self.native.graph.rec.remove_hooks))
            self.module_sums.graph = self.native.graph
        native = self.native
        first = 0  # the nodes this call walks: from here on (the native graph's)
        if native is not None:
            first = native.graph.size
            root_ids = native.start_pass(roots, self.forward.seq0)
            graph: Any = native.graph
            records: Any = native.records
            start = 0  # `NativeStep.begin` sets it
        else:
            walk = graph = self.walk
            first_new = len(walk.records)
            root_ids = [walk.walk_from(node) for node, _ in roots]
            self.hooks.install(walk.records[first_new:], self.handles)
            self.hooks.pass_index = index
            records = lambda: walk.records  # noqa: E731
            start = len(self.hooks.execution)
            first = first_new
        # each call's thumbnail size: NOTE [Repeated calls' thumbnails] in call_thumbs.py
        ops, new_params = graph.new_since(first)
        self.thumbs.at_call(roots, ops, new_params, native)
        bp = BackwardPass(index=index, api=api, roots=root_ids, root_grads=[],
                          retain_graph=bool(retain), create_graph=bool(create), start=start)
        self.passes.append(bp)
        if self.forward.carried:
            self._carried_calls(index, native, first)
        else:
            self.module_sums.plan()
            if native is not None and self.carry is not None and self.forward.recorded:
                keys, plans, marks = self.call_keys  # NOTE [Carried forwards] in tracer/record/carry.py
                keys.append(forward_key(native.graph, keys[-1] if keys else b""))
                plans.append(self.module_sums.plans)
                marks.append(self.module_sums.marks)
        self.hooks.watch_hidden_params(graph, self.model, self.handles)
        self.problems.at_backward(records, root_ids, values, index)  # problem finder
        return bp

    def _carried_calls(self, index: int, native: NativeStep | None, first: int) -> None:
        """A carried step's module calls, as backward call `index` starts: the kept step's same call's when the
        graph's key is that call's (NOTE [Carried forwards] in tracer/record/carry.py); else the nodes it walked
        get none."""
        carry = self.carry
        assert carry is not None
        got = None
        if native is not None:
            self.last_key = forward_key(native.graph, self.last_key)
            got = carry.carried(self.last_key, index)
        if got is None:
            self._note(NOT_CARRIED if index == 0 else SECOND_PASS)
            return
        assert native is not None  # `got` is None without the native graph
        # the kept lists, taken at the first call (the carry may be reset before the step ends), and the nodes
        # the matched calls walked
        mods, sources = (carry.modules, carry.sources) if index == 0 or self.kept is None else self.kept[:2]
        self.kept = (mods, sources, native.graph.size)
        self.module_sums.use(*got)

    def settle_params(self) -> None:
        """Summarise the parameters' gradients kept since their pass (NOTE [Settled at the step's end] in params.py):
        at the step's end, and before what the monitor sees change them in place."""
        if not self.params.pending:  # (nothing kept: no size to switch)
            return
        self.thumbs.first_size(self.native)
        changed = self.params.settle(self.native)
        if changed:
            n, names = len(changed), ", ".join(changed[:3]) + (", …" if len(changed) > 3 else "")
            self._note(f"{n} parameter gradient{'s' if n > 1 else ''} ({names})"
                       " changed in place after the last backward that reached them, not by a clip, GradScaler or an "
                       "optimizer step: st.params holds them as the step ended")

    def summarise_used(self, names: list[str], grads: list[torch.Tensor]) -> dict[str, Any]:
        """Name → summary of each of `grads`, the gradients a clip or an optimizer step used (NOTE [Parameter
        gradients] in params.py): a row of the native recorder's tensor table, else a `TensorTrace`; a gradient
        already summarised and unchanged is not summarised again (NOTE [Summarised once] in params.py)."""
        out, todo_names, todo_grads = self.params.made(names, grads)
        if todo_names:
            self.thumbs.first_size(self.native)  # NOTE [Repeated calls' thumbnails] in call_thumbs.py
            sums: list[Any] = self.native.summarise(todo_grads) if self.native is not None else [-1] * len(todo_grads)
            if min(sums) < 0:  # (Python summarises where the kernel did not)
                sums = [k if k >= 0 else self.summ.summarise_no_grad(g, None) for g, k in zip(todo_grads, sums)]
            out.update(zip(todo_names, sums))
            self.params.note_made(todo_names, todo_grads, sums)
        return out

    def _note(self, why: str) -> None:
        if why not in self.notes:
            self.notes.append(why)

    def _native_ok(self) -> bool:
        """The native recorder records this step (NOTE [Native recorder] in native.py)."""
        return self._python_why() is None

    def _python_why(self) -> str | None:
        """Why the Python recorder records this step; None when the native one does."""
        if self.recorder != "native":
            return ""
        if self.summ.keep_values:
            return "tensors='full': the native recorder keeps no gradient values"
        if self.hooks.breaker.armed:
            return "a breakpoint is set: the debugger pauses inside a Python hook"
        return None

    def _note_once(self, why: str) -> None:
        """Keep the reason something of this step went untraced in `st.meta["notes"]`, and warn about
        it once per `Tracer` (`warned`, shared by its steps)."""
        if why not in self.notes:
            self.notes.append(why)
        if why not in self.warned:
            self.warned.add(why)
            warnings.warn(f"gradscape: step {self.step}: {why}", RuntimeWarning, stacklevel=2)
