"""What the monitor installs for one step block, and removes when it ends (also when it raises).

NOTE [Monitor hooks]
    The monitor sees the calls of the block that matter to it without the user passing anything: the
    backward APIs (`Tensor.backward`, `torch.autograd.backward`, `torch.autograd.grad`: the roots are
    the losses) and GradScaler's unscale (`torch._amp_foreach_non_finite_check_and_unscale_(grads,
    found_inf, inv_scale)`, from `GradScaler._unscale_grads_`, whose frame names the optimizer), through
    wrappers of those four functions that exist while a block is open (NOTE [Patched backward] in
    tracer/record/patched_calls.py). Every other torch call of the block reaches torch as it would
    without gradscape. Global optimizer step pre/post hooks see every `optimizer.step()`: the post-hook
    reads the gradients the optimizer stepped with (unscaled, clipped: NOTE [Read at the post-hook] in
    `capture.py`).

    In a traced block the tracer's own mode (NOTE [Source lines] in tracer/record/forward.py) is handed
    the wrapper of `Tensor.backward` and records the backward with the function behind it; the wrapper
    was called first, so the monitor reads the losses before the tracer walks the graph and takes its
    norms after the pass. (Until this release the monitor had a torch-function mode of its own, below
    the tracer's: every torch call of every monitored step went through it.)
"""

from __future__ import annotations

from typing import Any

import torch.optim.optimizer as _optim

from gradscape.tracer import _compat
from gradscape.tracer.record import patched_calls

_active: list[Any] = []  # the captures of the open monitored blocks (one per thread that trains)


def _on_opt_pre(opt: Any, args: Any, kwargs: Any) -> None:
    for cap in _active:
        cap.on_optimizer_pre(opt, args, kwargs)
    return None


def _on_opt_post(opt: Any, args: Any, kwargs: Any) -> None:
    for cap in _active:
        cap.on_optimizer_post(opt)
    return None


_HOOKS: list[tuple[Any, Any, Any]] = [  # (registering function, hook, its handle)
    (_optim.register_optimizer_step_pre_hook, _on_opt_pre, None),
    (_optim.register_optimizer_step_post_hook, _on_opt_post, None)]


def _put(k: int) -> Any:
    """Hook `k` in place: registered the first time, then put back at its handle's key each time
    (`_compat.reinsert_hook`): a new `RemovableHandle`, with its weak references, and its removal cost a
    fifth of the monitor's time on a 0.1 ms step (NOTE [Sampled norms] in `sampling.py`)."""
    register, fn, h = _HOOKS[k]
    if h is None or not _compat.reinsert_hook(h, fn):
        h = register(fn)
        _HOOKS[k] = (register, fn, h)
    return h


class Installed:
    """The two global optimizer hooks of one block and its wrapped backward calls: `install()`; `remove()`
    takes them all off, once (idempotent). The hooks are in place while any block is open."""

    __slots__ = ("capture", "_on")

    def __init__(self, capture: Any) -> None:
        self.capture = capture
        self._on = False

    def install(self) -> None:
        if not _active:
            _put(0)
            _put(1)
        _active.append(self.capture)
        self._on = True
        patched_calls.install(self.capture)

    def remove(self) -> None:
        if not self._on:
            return
        self._on = False
        if self.capture in _active:
            _active.remove(self.capture)
        if not _active:
            for _, _, h in _HOOKS:
                if h is not None:
                    h.remove()
        patched_calls.uninstall(self.capture)  # idempotent: nothing when it is not installed
