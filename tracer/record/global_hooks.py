"""torch's global module and optimizer hooks, gradscape's one registration of each, shared by every open
step block: the forward recorders of the traced blocks (`add`) and the monitor's captures of the monitored
ones (`watch`: the optimizer hooks only, NOTE [Monitor hooks] in tracer/monitor/installed.py).

NOTE [Hooks under torch.compile]
    Dynamo inlines the global module hooks into a compiled module's graph and guards on the hook
    dicts' keys (each registration's id) and on the types on the function-mode stack. A hook
    registered anew for every traced step would fail those guards every traced step: a recompile
    each time, until the recompile limit leaves the module running eagerly. So the hooks are
    module-level functions put back at the same key every time (the key the first registration
    got, `_compat.reinsert_hook`), and the recorders of the open step blocks are found in `_active`;
    the hooks return at once while dynamo compiles (so no recorder's state is read into a graph), and
    the mode's type never changes. A compiled module thus compiles once more for traced steps (the
    hooks and the mode are there) and keeps both graphs; its compiled region is one node, attributed
    by the call of the compiled module (its wrapper's hooks run outside the graph).

The module hooks are installed when the first traced block opens (`add`) and removed when the last one
closes (`discard`); each step's `StepHandles` does that through its forward recorder's `stop`. The optimizer
hooks are there while any block, traced or monitored, is open (`add`, `watch`); they call the monitor's
captures first, then the recorders (the order the two registrations of each hook had when each kept its own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.optim.optimizer as _optim

from gradscape.tracer import _compat

compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


class ForwardObserver(Protocol):
    """What the hooks call on each open step's forward recorder (`ForwardRecorder`)."""

    def module_pre(self, mod: Any, args: Any) -> None: ...

    def module_post(self, mod: Any, args: Any, out: Any) -> None: ...

    def optimizer_pre(self, opt: Any, args: Any, kwargs: Any) -> None: ...

    def optimizer_post(self, opt: Any, args: Any, kwargs: Any) -> None: ...


class OptimizerWatcher(Protocol):
    """What the optimizer hooks call on each open monitored block's capture (`StepCapture`)."""

    def on_optimizer_pre(self, opt: Any, args: Any, kwargs: Any) -> None: ...

    def on_optimizer_post(self, opt: Any) -> None: ...


_active: list[ForwardObserver] = []  # the recorders of the open step blocks, oldest first
_watching: list[OptimizerWatcher] = []  # the monitor's captures of the open blocks (one per thread that trains)
_slots: dict[str, Any] = {}  # hook → the handle of its first registration, whose key it keeps


def _on_pre(mod: Any, args: Any) -> None:
    if compiling():
        return None
    for rec in _active:
        rec.module_pre(mod, args)
    return None


def _on_post(mod: Any, args: Any, out: Any) -> None:
    if compiling():
        return None
    for rec in _active:
        rec.module_post(mod, args, out)
    return None


def _on_opt_pre(opt: Any, args: Any, kwargs: Any) -> None:
    for cap in _watching:
        cap.on_optimizer_pre(opt, args, kwargs)
    for rec in _active:
        rec.optimizer_pre(opt, args, kwargs)
    return None


def _on_opt_post(opt: Any, args: Any, kwargs: Any) -> None:
    for cap in _watching:
        cap.on_optimizer_post(opt)
    for rec in _active:
        rec.optimizer_post(opt, args, kwargs)
    return None


Hook = tuple[str, Callable[..., Any], Callable[..., Any], dict[str, Any]]
_MODULE_HOOKS: tuple[Hook, ...] = (
    ("forward_pre", torch.nn.modules.module.register_module_forward_pre_hook, _on_pre, {}),
    ("forward", torch.nn.modules.module.register_module_forward_hook, _on_post, {"always_call": True}),
)
_OPTIMIZER_HOOKS: tuple[Hook, ...] = (
    ("optimizer_pre", _optim.register_optimizer_step_pre_hook, _on_opt_pre, {}),
    ("optimizer_post", _optim.register_optimizer_step_post_hook, _on_opt_post, {}),
)


# NOTE [No warning about our hooks]
#     `OptimizedModule.__call__` (what `torch.compile(module)` returns) warns at every call while any
#     global module hook is registered: such hooks also fire for the wrapper. Ours are meant to (that
#     is how a compiled region is attributed to its module), and a warning filter to hide the warning
#     would outlive the step (adding or removing one makes Python forget which warnings it already
#     showed once). So while our hooks are installed, the function torch asks
#     (`torch.nn.modules.module._has_any_global_hook`, looked up at each call) is one that counts every
#     global module hook but ours: the warning still comes for anyone else's. torch's own is put back
#     when the last step block closes; nothing else of the process is touched.
_ours: set[int] = set()  # the keys of our hooks in torch's global hook dicts
_torch_check: list[Any] = []  # torch's `_has_any_global_hook` while ours stands in for it


def _others_hooked() -> bool:
    """torch's `_has_any_global_hook` without counting ours."""
    ours = _ours
    return any(k not in ours for k in _compat.global_module_hook_keys())


def _install(hooks: tuple[Hook, ...]) -> None:
    """Register `hooks`, each at the key it had the first time (NOTE [Hooks under torch.compile])."""
    for name, register, fn, kwargs in hooks:
        handle = _slots.get(name)
        if handle is None or not _compat.reinsert_hook(handle, fn):
            _slots[name] = register(fn, **kwargs)


def _remove(hooks: tuple[Hook, ...]) -> None:
    for name, *_ in hooks:
        _slots[name].remove()


def _install_module_hooks() -> None:
    """The module hooks, and torch's check for global hooks leaving them out (NOTE [No warning about our
    hooks])."""
    _install(_MODULE_HOOKS)
    _ours.clear()
    _ours.update(_slots[name].id for name, *_ in _MODULE_HOOKS)
    check = _compat.global_hook_check()
    if check is not None and check is not _others_hooked:
        _torch_check[:] = [check]
        _compat.set_global_hook_check(_others_hooked)


def _remove_module_hooks() -> None:
    _remove(_MODULE_HOOKS)
    if _torch_check and _compat.global_hook_check() is _others_hooked:  # a check set over ours stays
        _compat.set_global_hook_check(_torch_check[0])
    _torch_check.clear()


def add(rec: ForwardObserver) -> None:
    """An open step block's recorder: the hooks call it from now on (installed with the first one)."""
    if not _active:
        _install_module_hooks()
        if not _watching:
            _install(_OPTIMIZER_HOOKS)
    _active.append(rec)


def discard(rec: ForwardObserver) -> None:
    """The recorder's step block closed; the hooks go with the last one. Idempotent."""
    if rec in _active:
        _active.remove(rec)
        if not _active:
            _remove_module_hooks()
            if not _watching:
                _remove(_OPTIMIZER_HOOKS)


def watch(cap: OptimizerWatcher) -> None:
    """An open monitored block's capture: the optimizer hooks call it from now on, before the recorders."""
    if not _active and not _watching:
        _install(_OPTIMIZER_HOOKS)
    _watching.append(cap)


def unwatch(cap: OptimizerWatcher) -> None:
    """The capture's block closed; the optimizer hooks go with the last block of either kind. Idempotent."""
    if cap in _watching:
        _watching.remove(cap)
        if not _watching and not _active:
            _remove(_OPTIMIZER_HOOKS)
