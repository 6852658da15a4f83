"""The backward calls (and GradScaler's unscale) of a monitored block, seen without a torch-function mode: the four
functions (and the clipping of NOTE [Clipping seen]) wrapped while such a block is open, each call handed to the
block's capture.

NOTE [Patched backward]
    A torch-function mode sends every torch call of the block through Python (`handle_torch_function`
    and the mode's handler): a pass-through mode alone made a plain step of the 3-20-30-2 MLP 65 µs
    slower (1.16x) and one of the regression program 33 µs (1.16x), interleaved in one run. The
    monitor needs only the backward calls (`Tensor.backward`, `torch.autograd.backward`,
    `torch.autograd.grad`) and GradScaler's unscale (`torch._amp_foreach_non_finite_check_and_unscale_`).
    So while a monitored block is open, those four are wrappers (`install`, `uninstall`): a call from
    the block's thread goes to its capture, with the original function; every other call (another
    thread's, one made while a call is being handled, such as `Tensor.backward`'s own call of
    `torch.autograd.backward`, or one under dynamo) goes straight to the original. They are put in
    place when the first such block opens and the originals put back when the last one closes and
    no hold is left.

    The tracer's mode (a traced block) is handed `Tensor.backward` as its class attribute, which is the
    wrapper then: `original_of` gives it the function behind it (NOTE [Monitor hooks] in
    tracer/monitor/installed.py says in which order the two see a backward).

    What a wrapper does not see: a function taken by name before the block opened (`from torch.autograd
    import grad`, then `grad(...)`) is the original. Its losses are not in the row; `loss.backward()`,
    `torch.autograd.grad(...)` and GradScaler are seen. (A traced step's mode sees such a call: NOTE
    [Backward by name] in tracer/record/backward_by_name.py.) Two monitored blocks of two Tracers open on one
    thread: the calls go to the innermost.

    A traced block of a Tracer without the monitor installs a capture of its own (NOTE [Backward handoff]
    in handoff.py), so that its carried steps' backward calls reach the recorder too.
    Between a Tracer's blocks the wrappers stay in place while its monitor, or a Tracer without one, holds
    them (`Hold`, from the monitor's or the Tracer's start to `Tracer.close()` or the Tracer's collection),
    and a call then finds no capture and goes straight to the original. Putting them back and in place
    again each step cost more than the calls:
    an attribute set on `torch.Tensor` empties the interpreter's attribute caches of every type, and a
    monitored step of the 3-20-30-2 MLP paid 36-65 µs for it (1.31-1.36x a plain step, 1.24x held;
    interleaved in one run).

NOTE [Fronts]
    Where the native recorder's extension is built, each of the three backward functions is a C front
    (`backward_front` in tracer/record/csrc/light_types.h) in front of its Python wrapper: a call the wrapper
    would hand straight to the original (no capture open on the thread, or a call of the thread being handled:
    `Tensor.backward`'s own call of `torch.autograd.backward`) goes to the original from C, with no Python frame;
    the others go to the wrapper, which also passes a call under dynamo. Every backward call of a Tracer's
    process runs through `torch.autograd.backward`, a plain step's between blocks too, so its Python wrapper's
    frame was paid on every step (docs/costs.md has what it cost a small step).

NOTE [Clipping seen]
    `clip_grad_norm_` and `clip_grad_value_` are seen the same way, after they return (the gradients
    are clipped then): `torch.nn.utils.clip_grad._clip_grads_with_norm_`, which `clip_grad_norm_` looks
    up in its module's globals at each call (so a `from torch.nn.utils import clip_grad_norm_` made
    before the block is seen too), the public `clip_grads_with_norm_`, and `clip_grad_value_` under its
    two names (one taken by name before the block opened is not seen). The capture takes the clipped
    gradients' norms, and in a traced step their summaries (`on_clip` in tracer/monitor/capture.py).
"""

from __future__ import annotations

import functools
import sys
import threading
from operator import is_, itemgetter
from typing import Any

import torch

from gradscape.tracer.record.global_hooks import compiling

_TARGETS: tuple[tuple[Any, str, str], ...] = (
    (torch.Tensor, "backward", "Tensor.backward"),
    (torch.autograd, "backward", "autograd.backward"),
    (torch.autograd, "grad", "autograd.grad"),
)
_UNSCALE = "_amp_foreach_non_finite_check_and_unscale_"
# the gradient clipping of `torch.nn.utils` (NOTE [Clipping seen]): `clip_grad_norm_` calls its module's
# `_clip_grads_with_norm_` by name, so that one wrapper sees it however the loop imported it
_CLIPS: tuple[tuple[Any, str, str], ...] = (
    (torch.nn.utils.clip_grad, "_clip_grads_with_norm_", "clip_grad_norm_"),
    (torch.nn.utils, "clip_grads_with_norm_", "clip_grad_norm_"),
    (torch.nn.utils.clip_grad, "clip_grad_value_", "clip_grad_value_"),
    (torch.nn.utils, "clip_grad_value_", "clip_grad_value_"),
)

_lock = threading.Lock()
_captures: dict[int, list[Any]] = {}  # thread id -> the captures of the untraced blocks open on it, innermost last
_held = 0  # the live `Hold`s: while any, the wrappers stay in place between blocks
_placed = False  # the wrappers were put in place, or found there, and not put back since
_wrapped: dict[Any, Any] = {}  # wrapper -> the original it calls (kept: a mode may be handed one after it is off)
_handling: set[int] = set()  # the threads a call of which is being handled (their nested calls pass through)
_ident = threading.get_ident


def handling() -> bool:
    """A wrapped backward call of this thread is being handled now (the recorder asks, to know that the
    wrappers see this step's backward calls: NOTE [Carried forwards] in tracer/record/carry.py)."""
    return _ident() in _handling


def original_of(func: Any) -> Any:
    """The function behind one of the wrappers, or `func` itself."""
    return _wrapped.get(func, func)


def _backward_wrapper(original: Any, api: str) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _captures:  # (between blocks: straight to the original)
            tid = _ident()
            caps = _captures.get(tid)
            if caps and tid not in _handling and not compiling():
                _handling.add(tid)
                try:
                    return caps[-1].on_backward(api, original, args, kwargs)
                finally:
                    _handling.discard(tid)
        return original(*args, **kwargs)

    return _front(wrapper, original, api == "Tensor.backward")


def _front(wrapper: Any, original: Any, reads: bool) -> Any:
    """The wrapper behind the extension's front, where the extension is built: it hands a call the wrapper would
    pass straight to the original (NOTE [Fronts]), and `Tensor.backward`'s (`reads`) reads a native light step's
    losses in C++ (NOTE [Native light steps] in tracer/monitor/light_native.py)."""
    from gradscape.tracer.record import native

    ext = native.extension()
    return ext.backward_front(wrapper, original, _captures, _handling, reads) if ext is not None else wrapper


def _unscale_wrapper(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        caps = _captures.get(_ident()) if _captures else None
        if not caps or _ident() in _handling or compiling():
            return original(*args, **kwargs)
        caps[-1].before_change()
        out = original(*args, **kwargs)
        caps[-1].on_unscale(args, _scaler_optimizer(sys._getframe(1)))
        return out

    return wrapper


def _scaler_optimizer(frame: Any) -> Any:
    """The optimizer whose gradients GradScaler unscales: a local of `GradScaler._unscale_grads_`, the
    caller of the unscale op (a few frames up when the tracer's own mode sat above ours)."""
    for _ in range(6):
        if frame is None:
            return None
        if frame.f_code.co_name == "_unscale_grads_":
            return frame.f_locals.get("optimizer")
        frame = frame.f_back
    return None


def _clip_wrapper(original: Any, api: str) -> Any:
    @functools.wraps(original)
    def wrapper(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        caps = _captures.get(_ident()) if _captures else None
        if not caps or _ident() in _handling or compiling():
            return original(parameters, *args, **kwargs)
        if not isinstance(parameters, torch.Tensor):
            parameters = list(parameters)  # a generator (`model.parameters()`) is read once: by the original
        caps[-1].before_change(clip=True)
        out = original(parameters, *args, **kwargs)
        caps[-1].on_clip(api, [parameters] if isinstance(parameters, torch.Tensor) else parameters)
        return out

    return wrapper


_made: dict[tuple[Any, str], tuple[Any, Any]] = {}  # (owner, name) -> (the original, its wrapper), made once


def _wrapper_of(owner: Any, name: str, make: Any) -> Any:
    """The wrapper of `owner.name` as it is now (made once per original: making one costs more than the rest
    of `install`)."""
    original = getattr(owner, name)
    made = _made.get((owner, name))
    if made is None or made[0] is not original:
        made = _made[(owner, name)] = (original, make(original))
        _wrapped[made[1]] = original
    return made[1]


def _maker(make: Any, api: str) -> Any:
    return lambda f: make(f, api)


# (owner, name, the wrapper's maker) of every function wrapped, in the order they are put in place
_PLAN: list[tuple[Any, str, Any]] = [
    *[(owner, name, _maker(_backward_wrapper, api)) for owner, name, api in _TARGETS],
    (torch, _UNSCALE, _unscale_wrapper),
    *[(owner, name, _maker(_clip_wrapper, api)) for owner, name, api in _CLIPS]]


_last: list[tuple[Any, Any]] = [(None, None)] * len(_PLAN)  # (original, wrapper) each was last put in place with
_OWNERS, _NAMES = [owner for owner, _, _ in _PLAN], [name for _, name, _ in _PLAN]


class Hold:
    """A monitor's (or a Tracer's without one) hold on the wrappers between its blocks (see NOTE [Patched
    backward]); `release()` lets go, once, and puts the originals back when no other hold or open block needs
    them."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        global _held
        with _lock:
            _held += 1
        self.on = True

    def release(self) -> None:
        global _held
        with _lock:
            if not self.on:
                return
            self.on = False
            _held -= 1
            if not _held and not _captures:
                _put_back()


def placed() -> bool:
    """The wrappers are in place, kept by a hold (a light step that puts no capture in place through `install`
    may then open: NOTE [Native light steps] in tracer/monitor/light_native.py)."""
    return bool(_held and _placed)


def install(capture: Any, checked: bool = True) -> None:
    """The wrappers in place (if no other block put them there, or a hold kept them) and `capture` as this
    thread's innermost. `checked` False (a light step's): while a hold keeps them, the wrappers are not looked
    at again (they are at the next full step's block: NOTE [Light steps] in tracer/monitor/light.py)."""
    global _placed
    with _lock:
        if not _captures and (checked or not (_held and _placed)) and not _all_in_place():
            _placed = True
            for k, (owner, name, make) in enumerate(_PLAN):
                original, wrapper = _last[k]
                current = getattr(owner, name)
                if current is wrapper and wrapper is not None:  # kept in place by a hold: no attribute set
                    continue
                if current is not original:  # (the usual: the same original as last time)
                    wrapper = _wrapper_of(owner, name, make)
                    _last[k] = (_wrapped[wrapper], wrapper)
                setattr(owner, name, wrapper)
        _captures.setdefault(threading.get_ident(), []).append(capture)


def _all_in_place() -> bool:
    """Every wrapper last put in place is where it was put (the usual, while a hold keeps them): looked at in C-level
    passes, no Python a function (a full step's block looks at all of them: NOTE [Light steps] in
    tracer/monitor/light.py)."""
    return _placed and all(map(is_, map(getattr, _OWNERS, _NAMES), map(itemgetter(1), _last)))


def uninstall(capture: Any) -> None:
    """`capture` gone (from whichever thread it was installed on); the originals back when no block or hold is
    left."""
    with _lock:
        tid = threading.get_ident()
        caps = _captures.get(tid)
        if caps is not None and caps[-1] is capture:  # (the usual: this thread's innermost)
            caps.pop()
        else:
            found = [t for t, caps in _captures.items() if any(c is capture for c in caps)]
            if not found:
                return
            tid = found[0]
            caps = _captures[tid]
            caps[:] = [c for c in caps if c is not capture]
        if not caps:
            del _captures[tid]
        if not _captures and not _held:
            _put_back()


def _put_back() -> None:
    """The originals back where the wrappers still are (`_lock` held)."""
    global _placed
    _placed = False
    for (owner, name), (original, wrapper) in _made.items():
        if getattr(owner, name) is wrapper:  # put back only what is still ours
            setattr(owner, name, original)
