"""What the monitor installs for one step block, and removes when it ends (also when it raises).

NOTE [Monitor hooks]
    The monitor sees the calls of the block that matter to it without the user passing anything: the backward
    APIs (`Tensor.backward`, `torch.autograd.backward`, `torch.autograd.grad`: the roots are the losses) and
    GradScaler's unscale (`torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)`,
    from `GradScaler._unscale_grads_`, whose frame names the optimizer), through wrappers of those four
    functions and of the gradient clipping (NOTE [Clipping seen] in tracer/record/patched_calls.py), in
    place while a block is open and held between a Tracer's blocks (NOTE [Patched backward] in
    tracer/record/patched_calls.py). Every other torch call of the block reaches torch as it would without
    gradscape. torch's global optimizer step pre/post hooks (gradscape's one registration of each, in
    tracer/record/global_hooks.py, shared with the recorder) see every `optimizer.step()`: the post-hook reads
    the gradients the optimizer stepped with (unscaled, clipped: NOTE [Read at the post-hook] in
    `capture.py`).

    In a traced block the tracer's own mode (NOTE [Source lines] in tracer/record/forward.py) is handed
    the wrapper of `Tensor.backward` and records the backward with the function behind it; the wrapper
    was called first, so the monitor reads the losses before the tracer walks the graph and takes its
    norms after the pass. (Until this release the monitor had a torch-function mode of its own, below
    the tracer's: every torch call of every monitored step went through it.)
"""

from __future__ import annotations

from typing import Any

from gradscape.tracer.record import global_hooks, patched_calls


class Installed:
    """One block's place in the global optimizer hooks (tracer/record/global_hooks.py, their one owner:
    `watch`) and among the wrapped backward calls' captures (tracer/record/patched_calls.py, theirs):
    `install()`; `remove()` leaves both, once (idempotent). Two calls each way, on every monitored step:
    no handle objects (the handles of a traced step's hooks are `tracer/record/handles.py`'s)."""

    __slots__ = ("capture", "on")

    def __init__(self, capture: Any) -> None:
        self.capture = capture
        self.on = False

    def install(self) -> None:
        global_hooks.watch(self.capture)
        self.on = True
        patched_calls.install(self.capture)

    def remove(self) -> None:
        """The block's capture leaves the optimizer hooks, and its wrappers (NOTE [Patched backward])."""
        if self.on:
            self.on = False
            global_hooks.unwatch(self.capture)
            patched_calls.uninstall(self.capture)  # idempotent: nothing when it is not installed
