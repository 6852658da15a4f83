"""The node hooks of one traced step.

NOTE [One hook per node]
    A node post-hook `fn(grad_inputs, grad_outputs)` sees both ends of the node: what arrived (the
    engine keeps the inputs for it, after every tensor pre-hook ran) and what the node sent on. So
    each node gets that one hook, and no pre-hook: every hook is a registration, a removal and a
    call out of the engine per node per step. The exception is AccumulateGrad, which gets a pre-hook
    only: it sends nothing on, and after it ran `.grad` may already be rewritten in place (DDP).
    A node's `time_us` is therefore the time on its engine thread from the return of our previous
    hook there (or the start of the backward) to its post-hook: the node's own work plus the
    engine's scheduling around it, never our summaries.

NOTE [Dedupe]
    The tensor a node sends along an edge is the very tensor its child receives when that child
    output has a single producer. The post-hook leaves its summary under (child, input_nr); the
    child's hook takes it if the tensor (address, shape, strides, dtype) is the same (the id of its
    Python object would be cheaper, but whether torch keeps that object alive while the tensor waits
    in the engine's input buffer is an implementation detail). The entry
    lives only while the tensor sits in the engine's input buffer, so memory reuse cannot fake a
    match. View-like nodes (`VIEW_NODES`) send on the same elements in another shape: their
    `grad_inputs[0]` reuses the statistics and computes only the thumbnail.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer._model import NodeRun, TensorTrace
from gradscape.tracer.record.debug.breakpoints import Breaker
from gradscape.tracer.record.handles import StepHandles
from gradscape.tracer.record.labels import VIEW_NODES
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.record.module_sums import ModuleSums
from gradscape.tracer.record.params import ParamGradients
from gradscape.tracer.record.view import StepView
from gradscape.tracer.record.walk import NodeRecord
from gradscape.tracer.summary.summariser import Summariser

log = logging.getLogger(__name__)

now = time.perf_counter_ns
_thread_id = threading.get_ident
_grad_enabled = torch.is_grad_enabled
_set_grad = _compat.set_grad_enabled
_STRIDED = torch.strided


class NodeHooks:
    """The node hooks of one step and what they record while a backward runs: `execution` (every node
    run, in order), the node's runs themselves (`NodeRecord.runs`), the summaries a node leaves for
    its child (`handoff`, NOTE [Dedupe]), the parameters' arrivals (`ParamGradients`) and the module
    sums (`ModuleSums`). `view` and `breaker`: what a breakpoint reads and who matches it."""

    def __init__(self, step: int, summariser: Summariser, params: ParamGradients, module_sums: ModuleSums,
                 breaker: Breaker, view: StepView, execution: list[tuple[int, int]]) -> None:
        self.step, self.summ, self.params, self.module_sums = step, summariser, params, module_sums
        self.breaker, self.view = breaker, view
        self.execution = execution  # (node id, run index) in the order the nodes ran: the hooks append
        # (child id, input_nr) → (address, (shape, strides, dtype), summary) of what its single sender sent there
        self.handoff: dict[tuple[int, int], tuple[int, tuple[Any, ...], TensorTrace]] = {}
        self.last_end: dict[int, int] = {}  # engine thread → when our last hook on it returned (ns)
        self.pass_index = -1  # the backward pass running
        self.pass_t0 = 0  # when it started (ns)
        self.hidden: dict[Any, str] = {}  # AccumulateGrad nodes outside the walked graph → their parameter
        self._summarise = summariser.summarise_no_grad  # hooks turn grad mode off once for all their tensors
        self._warned_unreadable = False
        self._hooks: tuple[Any, Any] | None = None  # the step's two hook functions (`_make_hooks`)

    def install(self, records: list[NodeRecord], handles: StepHandles) -> None:
        """One hook on each of `records` (NOTE [One hook per node])."""
        add = handles.add
        if self._hooks is None:
            self._hooks = self._make_hooks()
        pre, post = self._hooks
        for rec in records:
            if rec.kind in ("param", "leaf"):
                add(rec.node.register_prehook(partial(pre, rec)))
            else:
                add(rec.node.register_hook(partial(post, rec)))

    def release(self) -> None:
        """Drop what the step's hooks left behind, and the hook functions themselves (they refer back
        to this object: a cycle, left to the cyclic collector otherwise)."""
        self.handoff = {}
        self.hidden = {}
        self._hooks = None

    def watch_hidden_params(self, graph: Any, model: ModelIndex, handles: StepHandles) -> None:
        """A reentrant checkpoint (or a custom Function running its own backward) computes parameter
        gradients in a graph the walk cannot see. Holding the parameter's AccumulateGrad node makes
        that inner graph use it, so a pre-hook there still records the arriving gradient in
        `st.params` (the node itself is not part of the drawn graph)."""
        if not graph.has_kinds("checkpoint", "custom"):
            return
        for p, name in model.params:
            if not p.requires_grad:
                continue
            node = torch.autograd.graph.get_gradient_edge(p).node
            if graph.id_of(node) is not None or node in self.hidden:
                continue
            self.hidden[node] = name
            handles.add(node.register_prehook(self.hidden_param_hook(name)))

    def hidden_param_hook(self, name: str) -> Any:
        def pre(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            g = grad_outputs[0] if grad_outputs else None
            if g is not None:
                self.params.note_arrival(name, g, self.summ.summarise(g))
            return None

        return pre

    # The hooks run once per node per step, inside backward, where every Python operation costs 2-3×
    # its warm time (the kernels around a hook evict the interpreter's caches). So they are written
    # for speed, each change measured: two functions per step, made by `_make_hooks`, with what they
    # use bound once as closure variables; each node's hook is `partial(fn, rec)` (two small objects
    # per node, where a closure per node made a dozen cells); one grad-mode check per hook rather than
    # per tensor; the execution order taken from the position in `execution` at assembly (a list
    # append is atomic; no lock); where a summary goes for dedupe decided by the walk
    # (`NodeRecord.send`); a gradient's address and layout read once, for its dedupe identity and its
    # summary both (`Summariser.summarise_keyed`).
    def _make_hooks(self) -> tuple[Any, Any]:
        """The step's AccumulateGrad pre-hook `pre(rec, grad_outputs)` and post-hook `post(rec, grad_inputs,
        grad_outputs)`, each written out in one function (their names bound as locals: they run per node)."""
        arrived = self._make_arrived()
        return self._make_pre(arrived), self._make_post(arrived)

    def _make_arrived(self) -> Any:
        take, keyed, summarise = self.handoff.pop, self.summ.summarise_keyed, self._summarise

        def arrived(rid: int, grad_outputs: tuple[torch.Tensor | None, ...], gos: list[TensorTrace | None]) -> None:
            """What arrived at node `rid` (NOTE [Dedupe]), summarised into `gos`."""
            for i, g in enumerate(grad_outputs):
                if g is None:
                    gos.append(None)
                else:
                    hit = take((rid, i), None)
                    if hit is not None and hit[0] == g.data_ptr() and hit[1] == (g.shape, g.stride(), g.dtype):
                        gos.append(hit[2])
                    elif g.layout is _STRIDED:
                        gos.append(keyed(g, g.data_ptr(), (g.shape, g.stride(), g.dtype), None))
                    else:
                        gos.append(summarise(g, None))

        return arrived

    def _make_pre(self, arrived: Any) -> Any:
        hooks, execution_append, last_end, brk, params = (self, self.execution.append, self.last_end, self.breaker,
                                                          self.params)

        def pre(rec: NodeRecord, grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            """AccumulateGrad: a pre-hook, which sees the gradient before `.grad` is written (a post-hook
            could see it already rewritten in place, e.g. by DDP's reducer). `ParamGradients.note_arrival`
            inlined."""
            runs = rec.runs
            run = NodeRun(hooks.pass_index, -1, [], None)  # order: set from `execution` in finish()
            execution_append((rec.id, len(runs)))
            runs.append(run)
            grad_on = _grad_enabled()  # on in a create_graph backward: summaries must not record
            if grad_on:
                _set_grad(False)
            try:
                arrived(rec.id, grad_outputs, run.grad_outputs)
                g = grad_outputs[0] if grad_outputs else None
                if rec.param is not None and g is not None:
                    key = (g.data_ptr(), g.shape, g.stride(), g.dtype) if g.layout is _STRIDED else None
                    params.arrived[rec.param] = (run.grad_outputs[0], key)  # see `ParamGradients.note_arrival`
            except Exception as exc:  # never let the tracer break the user's backward
                hooks._unreadable(run, (), grad_outputs, exc)
            finally:
                if grad_on:
                    _set_grad(True)
            if brk.armed:  # breakpoints (NOTE [Breakpoints]): False unless one is set
                brk.at_node(hooks.view, rec, None, grad_outputs)
            last_end[_thread_id()] = now()
            return None

        return pre

    def _make_post(self, arrived: Any) -> Any:
        hooks, execution_append, handoff, last_end = self, self.execution.append, self.handoff, self.last_end
        keyed, summarise, brk, add_to_sum = (self.summ.summarise_keyed, self._summarise, self.breaker,
                                             self.module_sums.add)

        def post(rec: NodeRecord, grad_inputs: tuple[torch.Tensor | None, ...],
                 grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            t1 = now()
            tid = _thread_id()
            t0 = last_end.get(tid, 0)
            if t0 < hooks.pass_t0:
                t0 = hooks.pass_t0
            runs = rec.runs
            run = NodeRun(hooks.pass_index, -1, [], None, (t1 - t0) / 1e3)
            execution_append((rec.id, len(runs)))  # order: the position here, set in finish()
            runs.append(run)
            grad_on = _grad_enabled()
            if grad_on:
                _set_grad(False)
            try:
                gos = run.grad_outputs
                arrived(rec.id, grad_outputs, gos)
                view_of = gos[0] if gos and rec.name in VIEW_NODES else None
                send, sums = rec.send, rec.sums  # set by the walk, after this hook was made
                out: list[TensorTrace | None] = []
                for j, g in enumerate(grad_inputs):  # what it sends on
                    if g is None:
                        out.append(None)
                    elif g.layout is _STRIDED:
                        ptr, key = g.data_ptr(), (g.shape, g.stride(), g.dtype)
                        tr = keyed(g, ptr, key, view_of if view_of is not None and j == 0
                                   and g.numel() == view_of.numel else None)
                        out.append(tr)
                        child = send[j] if j < len(send) else None
                        if child is not None:
                            handoff[child] = (ptr, key, tr)
                        if sums is not None and j in sums:
                            add_to_sum(sums[j], g)
                    else:  # sparse: no address to dedupe by
                        out.append(summarise(g, None))
                        if sums is not None and j in sums:
                            add_to_sum(sums[j], g)
                run.grad_inputs = out
            except Exception as exc:  # never let the tracer break the user's backward
                hooks._unreadable(run, grad_inputs, grad_outputs, exc)
            finally:
                if grad_on:
                    _set_grad(True)
            if brk.armed:  # breakpoints (NOTE [Breakpoints]): False unless one is set
                brk.at_node(hooks.view, rec, grad_inputs, grad_outputs)
            last_end[tid] = now()
            return None

        return post

    def _unreadable(self, run: NodeRun, grad_inputs: tuple[torch.Tensor | None, ...],
                    grad_outputs: tuple[torch.Tensor | None, ...], exc: Exception) -> None:
        """A hook's fast path failed on one of the node's gradients: summarise each one on its own,
        without dedupe or module sums, so what can be read is kept and the backward goes on."""
        sparse = any(g is not None and g.layout != torch.strided for g in grad_inputs + grad_outputs)
        if not sparse and not self._warned_unreadable:  # a sparse gradient has no pointer to dedupe by
            self._warned_unreadable = True
            log.warning("gradscape: a gradient of step %s could not be summarised on the fast path (%s: %s); "
                        "summarised one by one", self.step, type(exc).__name__, exc)
        run.grad_outputs = [None if g is None else self._safe_summary(g) for g in grad_outputs]
        if grad_inputs:
            run.grad_inputs = [None if g is None else self._safe_summary(g) for g in grad_inputs]

    def _safe_summary(self, g: torch.Tensor) -> TensorTrace:
        try:
            return self.summ.summarise(g)
        except Exception as exc:
            log.warning("gradscape: could not summarise a %s gradient: %s", g.layout, exc)
            try:
                shape = tuple(int(d) for d in g.shape)
            except Exception:
                shape = ()
            return TensorTrace(shape, str(g.dtype).replace("torch.", ""), {}, None, "not summarised", None,
                               str(g.device))
