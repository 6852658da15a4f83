"""What the monitor installs for one step block, and removes when it ends (also when it raises).

NOTE [Monitor mode]
    In a traced block a `TorchFunctionMode` sees the torch calls of the block that matter to the monitor,
    without the user passing anything (an untraced block wraps the few functions it needs instead, which
    costs nothing on the block's other torch calls: NOTE [Patched backward] in
    tracer/record/patched_calls.py): the backward APIs (`Tensor.backward`, `torch.autograd.backward`,
    `torch.autograd.grad`: the roots are the losses), and GradScaler's own calls
    (`torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)`, from
    `GradScaler._unscale_grads_`, whose frame names the optimizer). Global optimizer step pre/post hooks
    see every `optimizer.step()`: the post-hook reads the gradients the optimizer stepped with
    (unscaled, clipped: NOTE [Read at the post-hook] in `capture.py`). Every other call goes straight
    through; the mode leaves the stack during an optimizer step given no closure (dozens of calls that
    matter to nobody) when it is on top, and stays aside until the
    next module call on this thread (a global module pre-hook that exists only while the mode is aside),
    so a `zero_grad()` after the step costs nothing either. A backward after an optimizer step in the
    same block with no module call in between is therefore not seen by the monitor's mode (the tracer
    still traces it: its own mode is back by then; an untraced block's wrappers see it).
    Under a traced step the tracer's own mode sits above this one (see NOTE [Source lines] in
    `tracer/record/forward.py`), so a backward reaches it after the tracer has instrumented the graph.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch
import torch.optim.optimizer as _optim
from torch.overrides import TorchFunctionMode

from gradscape.tracer import _compat
from gradscape.tracer.record import patched_calls as patches
from gradscape.tracer.record.forward import _is_compiling, _remove_mode
from gradscape.tracer.record.handles import CallOnRemove, StepHandles
from gradscape.tracer.record.patched_calls import original_of

_BACKWARD = {torch.Tensor.backward: "Tensor.backward", torch.autograd.backward: "autograd.backward",
             torch.autograd.grad: "autograd.grad"}
_UNSCALE = _compat.amp_unscale


class MonitorMode(TorchFunctionMode):
    steps_aside_in_leaves = True  # a library leaf makes no call this mode wants (NOTE [Library leaves])

    def __init__(self, capture: Any) -> None:
        super().__init__()
        self.capture = capture

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if kwargs is None:
            kwargs = {}
        func = original_of(func)  # another thread's untraced block may have wrapped it (NOTE [Patched backward])
        api = _BACKWARD.get(func)  # every other call goes straight through, with nothing more to pay
        if api is not None and not _is_compiling():
            return self.capture.on_backward(api, func, args, kwargs)
        if func is _UNSCALE and not _is_compiling():
            out = func(*args, **kwargs)
            self.capture.on_unscale(args, sys._getframe(1))
            return out
        return func(*args, **kwargs)


_active: list[Any] = []  # the captures of the open monitored blocks (one per thread that trains)


def _on_opt_pre(opt: Any, args: Any, kwargs: Any) -> None:
    for cap in _active:
        cap.on_optimizer_pre(opt, args, kwargs)
    return None


def _on_opt_post(opt: Any, args: Any, kwargs: Any) -> None:
    for cap in _active:
        cap.on_optimizer_post(opt)
    return None


def _on_module_pre(mod: Any, args: Any) -> None:
    if _compat.current_graph_task_id() != -1:  # a forward recomputed inside backward (checkpoint)
        return None
    for cap in _active:
        cap.installed.resume()
    return None


class Installed:
    """What one block installs, every piece held by one `StepHandles` (tracer/record/handles.py, the owner
    of a step's hooks): the two global optimizer hooks, and the mode (a traced block) or the patched
    backward (an untraced one: NOTE [Patched backward]). `install()`; `remove()` takes them all off,
    once (idempotent)."""

    def __init__(self, capture: Any) -> None:
        self.capture = capture
        self.mode = MonitorMode(capture)
        self.handles = StepHandles()
        self.aside = False
        self.on = False
        self.patched = False
        self.thread = 0
        self._resume_handle: Any = None

    def install(self) -> None:
        _active.append(self.capture)
        self.handles.add(CallOnRemove(self._leave))
        self.handles.add(_optim.register_optimizer_step_pre_hook(_on_opt_pre))
        self.handles.add(_optim.register_optimizer_step_post_hook(_on_opt_post))
        self.thread = threading.get_ident()
        if self.capture.traced is None:
            patches.install(self.capture)
            self.patched = True
            return
        _compat.push_mode(self.mode)
        self.on = True

    def step_aside(self) -> None:
        """Off the stack while an optimizer steps, when on top (a mode above stays as it is)."""
        n = _compat.mode_stack_len()
        if self.on and not self.aside and n and _compat.mode_at(n - 1) is self.mode:
            _compat.pop_mode()
            self.aside = True

    def resume_at_next_module(self) -> None:
        if self.aside and self.on and self._resume_handle is None:
            self._resume_handle = torch.nn.modules.module.register_module_forward_pre_hook(_on_module_pre)

    def resume(self) -> None:
        if self.aside and self.on and threading.get_ident() == self.thread:
            self.aside = False
            _compat.push_mode(self.mode)
        self._drop_resume_hook()

    def _drop_resume_hook(self) -> None:
        handle, self._resume_handle = self._resume_handle, None
        if handle is not None:
            handle.remove()

    def _leave(self) -> None:
        """The block's capture leaves `_active`, and its mode the stack (unless aside), with the resume hook."""
        if self.capture in _active:
            _active.remove(self.capture)
        if self.patched:
            patches.uninstall(self.capture)
            self.patched = False
        self._drop_resume_hook()
        if self.on and not self.aside:
            _remove_mode(self.mode)
        self.on = self.aside = False

    def remove(self) -> None:
        self.handles.remove()
