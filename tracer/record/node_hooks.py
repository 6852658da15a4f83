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
    child's hook takes it if the tensor (pointer, shape, strides, dtype) is the same. The entry
    lives only while the tensor sits in the engine's input buffer, so memory reuse cannot fake a
    match. View-like nodes (`VIEW_NODES`) send on the same elements in another shape: their
    `grad_inputs[0]` reuses the statistics and computes only the thumbnail.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer._model import NodeRun, TensorTrace
from gradscape.tracer.debug.breakpoints import Breaker
from gradscape.tracer.record.handles import StepHandles
from gradscape.tracer.record.labels import VIEW_NODES
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.record.module_sums import ModuleSums
from gradscape.tracer.record.params import ParamGradients
from gradscape.tracer.record.view import StepView
from gradscape.tracer.record.walk import GraphWalk, NodeRecord
from gradscape.tracer.summary.summariser import Summariser

log = logging.getLogger(__name__)

now = time.perf_counter_ns
_thread_id = threading.get_ident
_grad_enabled = torch.is_grad_enabled
_set_grad = _compat.set_grad_enabled


def _same_tensor(t: torch.Tensor) -> tuple[Any, ...]:
    """What identifies a gradient between the hook of the node that sent it and the hook of the node
    that receives it (NOTE [Dedupe]): where its elements are and how they are laid out. (The id of
    its Python object would be cheaper, but whether torch keeps that object alive while the tensor
    waits in the engine's input buffer is an implementation detail.) The hooks inline it."""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


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
        # (child id, input_nr) → (identity, summary) of what its single sender sent there (NOTE [Dedupe])
        self.handoff: dict[tuple[int, int], tuple[tuple[Any, ...], TensorTrace]] = {}
        self.last_end: dict[int, int] = {}  # engine thread → when our last hook on it returned (ns)
        self.pass_index = -1  # the backward pass running
        self.pass_t0 = 0  # when it started (ns)
        self.hidden: dict[Any, str] = {}  # AccumulateGrad nodes outside the walked graph → their parameter
        self._summarise = summariser.summarise_no_grad  # hooks turn grad mode off once for all their tensors
        self._warned_unreadable = False

    def install(self, records: list[NodeRecord], handles: StepHandles) -> None:
        """One hook on each of `records` (NOTE [One hook per node])."""
        add = handles.add
        for rec in records:
            if rec.kind in ("param", "leaf"):
                add(rec.node.register_prehook(self.acc_hook(rec)))
            else:
                add(rec.node.register_hook(self.post_hook(rec)))

    def watch_hidden_params(self, walk: GraphWalk, model: ModelIndex, handles: StepHandles) -> None:
        """A reentrant checkpoint (or a custom Function running its own backward) computes parameter
        gradients in a graph the walk cannot see. Holding the parameter's AccumulateGrad node makes
        that inner graph use it, so a pre-hook there still records the arriving gradient in
        `st.params` (the node itself is not part of the drawn graph)."""
        if not any(r.kind in ("checkpoint", "custom") for r in walk.records):
            return
        for p, name in model.param_names.items():
            if not p.requires_grad:
                continue
            node = torch.autograd.graph.get_gradient_edge(p).node
            if node in walk.ids or node in self.hidden:
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
    # for speed, each change measured: one grad-mode check per hook rather than per tensor, the
    # execution order taken from the position in `execution` at assembly (a list append is atomic;
    # no lock), where a summary goes for dedupe decided by the walk (`NodeRecord.send`), and each hook
    # written out in one function, `_same_tensor` inlined.
    def acc_hook(self, rec: NodeRecord) -> Any:
        """AccumulateGrad: a pre-hook, which sees the gradient before `.grad` is written (a post-hook
        could see it already rewritten in place, e.g. by DDP's reducer). Written out in one function,
        like the post-hook, with `ParamGradients.note_arrival` inlined and the identity of a deduplicated
        arrival taken from its `handoff` entry rather than read again."""
        rid, runs, param = rec.id, rec.runs, rec.param
        execution, handoff, summarise, last_end = self.execution, self.handoff, self._summarise, self.last_end
        brk, params = self.breaker, self.params

        def pre(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            run = NodeRun(self.pass_index, -1, [], None)  # order: set from `execution` in finish()
            execution.append((rid, len(runs)))
            runs.append(run)
            grad_on = _grad_enabled()  # on in a create_graph backward: summaries must not record
            if grad_on:
                _set_grad(False)
            try:
                gos = run.grad_outputs
                key: tuple[Any, ...] | None = None  # the identity of grad_outputs[0], where already read
                for i, g in enumerate(grad_outputs):  # what arrived (NOTE [Dedupe])
                    if g is None:
                        gos.append(None)
                        continue
                    hit = handoff.pop((rid, i), None)
                    if hit is not None and hit[0] == (g.data_ptr(), g.shape, g.stride(), g.dtype):
                        gos.append(hit[1])
                        if i == 0:
                            key = hit[0]
                    else:
                        gos.append(summarise(g, None))
                if param is not None and grad_outputs and grad_outputs[0] is not None:
                    g = grad_outputs[0]
                    if key is None and g.layout == torch.strided:
                        key = (g.data_ptr(), g.shape, g.stride(), g.dtype)
                    params.arrived[param] = (gos[0], key)  # see `ParamGradients.note_arrival`
            except Exception as exc:  # never let the tracer break the user's backward
                self._unreadable(run, (), grad_outputs, exc)
            finally:
                if grad_on:
                    _set_grad(True)
            if brk.armed:  # breakpoints (NOTE [Breakpoints]): False unless one is set
                brk.at_node(self.view, rec, None, grad_outputs)
            last_end[_thread_id()] = now()
            return None

        return pre

    def post_hook(self, rec: NodeRecord) -> Any:
        is_view = rec.name in VIEW_NODES
        rid, runs = rec.id, rec.runs
        # bound once: these containers live as long as the step
        execution, handoff, summarise, last_end = self.execution, self.handoff, self._summarise, self.last_end
        brk, add_to_sum = self.breaker, self.module_sums.add

        def post(grad_inputs: tuple[torch.Tensor | None, ...], grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            t1 = now()
            tid = _thread_id()
            run = NodeRun(self.pass_index, -1, [], None, (t1 - max(last_end.get(tid, 0), self.pass_t0)) / 1e3)
            execution.append((rid, len(runs)))  # order: the position here, set in finish()
            runs.append(run)
            grad_on = _grad_enabled()
            if grad_on:
                _set_grad(False)
            try:
                gos = run.grad_outputs
                for i, g in enumerate(grad_outputs):  # what arrived (NOTE [Dedupe])
                    if g is None:
                        gos.append(None)
                        continue
                    hit = handoff.pop((rid, i), None)
                    gos.append(hit[1] if hit is not None and hit[0] == (g.data_ptr(), g.shape, g.stride(), g.dtype)
                               else summarise(g, None))
                view_of = gos[0] if is_view and gos else None
                send, sums = rec.send, rec.sums  # set by the walk, after this hook was made
                out: list[TensorTrace | None] = []
                for j, g in enumerate(grad_inputs):  # what it sends on
                    if g is None:
                        out.append(None)
                        continue
                    tr = summarise(g, view_of if view_of is not None and j == 0 and g.numel() == view_of.numel
                                   else None)
                    out.append(tr)
                    child = send[j] if j < len(send) else None
                    if child is not None:
                        handoff[child] = ((g.data_ptr(), g.shape, g.stride(), g.dtype), tr)
                    if sums is not None and j in sums:
                        add_to_sum(sums[j], g)
                run.grad_inputs = out
            except Exception as exc:  # never let the tracer break the user's backward
                self._unreadable(run, grad_inputs, grad_outputs, exc)
            finally:
                if grad_on:
                    _set_grad(True)
            if brk.armed:  # breakpoints (NOTE [Breakpoints]): False unless one is set
                brk.at_node(self.view, rec, grad_inputs, grad_outputs)
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
