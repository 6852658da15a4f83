"""A `torch.autograd.backward` taken by name before a traced block, seen by the step's mode on releases whose
`backward` does not honour `__torch_function__`.

NOTE [Backward by name]
    The traced step's mode learns a backward's roots before it runs from the call itself (NOTE [Source
    lines] in tracer/record/forward.py): `Tensor.backward` and `torch.autograd.grad` honour
    `__torch_function__` on every supported release, `torch.autograd.backward` only on the later ones (on
    torch 2.9 it does not: a `from torch.autograd import backward` made before the block, then
    `backward(loss)`, reached neither the mode nor the wrappers of NOTE [Patched backward], and the step
    recorded no backward). On such a release, while a traced step's mode is on, `backward`'s own call of
    the engine is wrapped (`torch.autograd._engine_run_backward`, the name it reads from its module at each
    call; a module attribute, so putting it in place costs no type's caches): a call made with a step mode
    on top of this thread's stack is handed to that mode as the `backward` call it came from
    (`handle_torch_function`, which takes the mode off the stack for its handler, as a dispatching release
    does), and the handler's own call of `backward` reaches the engine with the mode off, straight through.
    Every other call (`torch.autograd.grad`'s, another thread's, one under a handler or with torch functions
    disabled, as the replay of a loss trigger hands its backward to the recorder) goes to the engine.
    Whether a release needs it is found by trying, once (`NEEDED`), not from its version.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.autograd
from torch.overrides import TorchFunctionMode, handle_torch_function

from gradscape.tracer import _compat
from gradscape.tracer.record.global_hooks import compiling
from gradscape.tracer.record.patched_calls import original_of

_NAME = "_engine_run_backward"
_lock = threading.Lock()
_users = 0  # the step modes on that need the wrapper: while any, it is in place
_engine: Any = None  # the engine function the wrapper calls (the one in place when it was put there)
_mode_type: type = type(None)  # the step mode's class (tracer/record/forward.py passes it in)


def _tried() -> bool:
    """Whether this release's `torch.autograd.backward` never reaches a function mode (tried at import, with no
    mode of the loop's on the stack: a mode below the one tried would see the trial's own calls)."""
    back = original_of(torch.autograd.backward)

    class _Seen(TorchFunctionMode):
        seen = False

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is back:
                _Seen.seen = True
                return None
            return func(*args, **(kwargs or {}))

    below = [_compat.pop_mode() for _ in range(_compat.mode_stack_len())]
    try:  # (imported under `no_grad` or `inference_mode` too)
        with torch.inference_mode(False), torch.enable_grad(), _Seen():
            back(torch.zeros((), requires_grad=True))
    except Exception:  # a trial that fails leaves the engine alone: such a call is then not seen, as before
        return False
    finally:
        for m in reversed(below):
            _compat.push_mode(m)
    return not _Seen.seen


NEEDED = hasattr(torch.autograd, _NAME) and _tried()


def acquire(mode_type: type) -> None:
    """A step mode of `mode_type` is going on: the wrapper in place if this release needs it."""
    global _users, _engine, _mode_type
    if not NEEDED:
        return
    with _lock:
        _users += 1
        if _users == 1:
            _mode_type = mode_type
            current = getattr(torch.autograd, _NAME)
            if current is not _wrapper:
                _engine = current
                setattr(torch.autograd, _NAME, _wrapper)


def release() -> None:
    """That mode is gone: the engine function back when no step mode needs the wrapper."""
    global _users
    if not NEEDED:
        return
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0 and getattr(torch.autograd, _NAME) is _wrapper:
            setattr(torch.autograd, _NAME, _engine)


def _wrapper(tensors: Any, grad_tensors: Any, retain_graph: Any, create_graph: Any, inputs: Any,
             allow_unreachable: bool = True, accumulate_grad: bool = True) -> Any:
    engine = _engine
    n = _compat.mode_stack_len()
    moded = n and _compat.modes_enabled() and isinstance(_compat.mode_at(n - 1), _mode_type)
    if accumulate_grad and moded and not compiling():
        back = original_of(torch.autograd.backward)
        return handle_torch_function(back, (), tensors, grad_tensors=grad_tensors, retain_graph=retain_graph,
                                     create_graph=create_graph, inputs=inputs or None)
    return engine(tensors, grad_tensors, retain_graph, create_graph, inputs,
                  allow_unreachable=allow_unreachable, accumulate_grad=accumulate_grad)
