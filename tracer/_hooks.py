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
from gradscape.tracer._labels import VIEW_NODES
from gradscape.tracer._model import NodeRun, TensorTrace
from gradscape.tracer._state import RecorderState
from gradscape.tracer._walk import _Rec

log = logging.getLogger(__name__)

_now = time.perf_counter_ns
_thread_id = threading.get_ident
_grad_enabled = torch.is_grad_enabled
_set_grad = _compat.set_grad_enabled


def _same_tensor(t: torch.Tensor) -> tuple[Any, ...]:
    """What identifies a gradient between the hook of the node that sent it and the hook of the node
    that receives it (NOTE [Dedupe]): where its elements are and how they are laid out. (The id of
    its Python object would be cheaper, but whether torch keeps that object alive while the tensor
    waits in the engine's input buffer is an implementation detail.)"""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


class HooksMixin(RecorderState):
    def _make_hidden_pre(self, name: str) -> Any:
        def pre(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            g = grad_outputs[0] if grad_outputs else None
            if g is not None:
                self._note_param(name, g, self.summ.summarise(g))
            return None

        return pre

    # The hooks run once per node per step, inside backward, where every Python operation costs 2-3×
    # its warm time (the kernels around a hook evict the interpreter's caches). So they are written
    # for speed, each change measured: one grad-mode check per hook rather than per tensor, the
    # execution order taken from the position in `execution` at assembly (a list append is atomic;
    # no lock), where a summary goes for dedupe decided by the walk (`_Rec.send`), and each hook
    # written out in one function, `_same_tensor` inlined.
    def _make_acc(self, rec: _Rec) -> Any:
        """AccumulateGrad: a pre-hook, which sees the gradient before `.grad` is written (a post-hook
        could see it already rewritten in place, e.g. by DDP's reducer). Written out in one function,
        like the post-hook, with `_note_param` inlined and the identity of a deduplicated arrival taken
        from its `_pending` entry rather than read again."""
        rid, runs, param = rec.id, rec.runs, rec.param
        execution, pending, summarise, last_end = self.execution, self._pending, self._summarise, self._last_end
        brk = self.breaker

        def pre(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            run = NodeRun(self._pass_index - 1, -1, [], None)  # order: set from `execution` in finish()
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
                    hit = pending.pop((rid, i), None)
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
                    self._arrived[param] = (gos[0], key)  # see `_note_param`
            except Exception as exc:  # never let the tracer break the user's backward
                self._unreadable(run, (), grad_outputs, exc)
            finally:
                if grad_on:
                    _set_grad(True)
            if brk.armed:  # breakpoints (NOTE [Breakpoints]): False unless one is set
                brk.at_node(self, rec, None, grad_outputs)
            last_end[_thread_id()] = _now()
            return None

        return pre

    def _make_post(self, rec: _Rec) -> Any:
        is_view = rec.name in VIEW_NODES
        rid, runs = rec.id, rec.runs
        # bound once: these containers live as long as the step (`_release` replaces them after it)
        execution, pending, summarise, last_end = self.execution, self._pending, self._summarise, self._last_end
        brk = self.breaker

        def post(grad_inputs: tuple[torch.Tensor | None, ...], grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            t1 = _now()
            tid = _thread_id()
            run = NodeRun(self._pass_index - 1, -1, [], None, (t1 - max(last_end.get(tid, 0), self._pass_t0)) / 1e3)
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
                    hit = pending.pop((rid, i), None)
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
                        pending[child] = ((g.data_ptr(), g.shape, g.stride(), g.dtype), tr)
                    if sums is not None and j in sums:
                        self._add_to_module_sum(sums[j], g)
                run.grad_inputs = out
            except Exception as exc:  # never let the tracer break the user's backward
                self._unreadable(run, grad_inputs, grad_outputs, exc)
            finally:
                if grad_on:
                    _set_grad(True)
            if brk.armed:  # breakpoints (NOTE [Breakpoints]): False unless one is set
                brk.at_node(self, rec, grad_inputs, grad_outputs)
            last_end[tid] = _now()
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

    def _note_param(self, name: str, g: torch.Tensor, tr: TensorTrace | None) -> None:
        """A gradient arrived at a parameter's AccumulateGrad node: its `.grad` is read when the pass
        ends (see `_params_after_pass`). The arrival's identity is kept, not the tensor (holding it
        would stop AccumulateGrad from taking it over as `.grad`)."""
        key = (g.data_ptr(), g.shape, g.stride(), g.dtype) if g.layout == torch.strided else None
        self._arrived[name] = (tr, key)
