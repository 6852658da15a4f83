"""Every private torch API that gradscape uses, in one place, checked against the torch version.

torch keeps no promise about `torch._C`: these names can change in any release. gradscape supports the
releases from MIN_TORCH to MAX_TESTED (`make test-torch TORCH=...` runs the core suite on each end; see
docs/install.md). An older torch is refused at import with an error that says so; a newer one imports
with one `UntestedTorchWarning` naming the tested range, and each name is looked up here, so a rename
fails at import with the name that is missing, not deep inside a training step. `PRIVATE_NAMES` lists
every name looked up (tests/test_compat.py resolves and calls each on every supported release).

NOTE [Torch floor]
    Why the range starts at 2.9: every private name below and the native recorder's C++ resolve on 2.9,
    and the floor is the oldest release the core suite is run on. Releases before it are not refused for
    a missing name that we know of but because no test has run on them; the recorder's headers are the
    part most likely to differ (tracer/record/csrc/torch_shims.h holds the differences).
    GRADSCAPE_ALLOW_UNTESTED_TORCH=1 tries an older one anyway.

What each is for (see docs/autograd.md):
- `sequence_nr()`: the autograd sequence number the next node created on this thread will get; the
  forward-op attribution matches nodes to the ops that made them with it.
- `DisableTorchFunction`: a context in which torch-function handlers (our mode) are not called.
- `push_mode` / `pop_mode` / `mode_stack_len` / `mode_at` / `modes_enabled`: the torch-function mode stack, as
  `TorchFunctionMode.__enter__/__exit__` use it; the tracer steps its mode aside around library
  leaf modules and optimizer steps, which costs less than leaving and re-entering the mode.
- `current_graph_task_id()`: -1 outside a backward pass (the engine's graph task on this thread).
- `set_grad_enabled(flag)`: the flag that `torch.no_grad` flips, without the context object's cost.
- `functorch_active()`: whether a torch.func transform is active (backward under one runs untraced). It reads the
  dispatch keys of this thread; functorch's own interpreter stack, read once, makes its thread state, which
  every later backward call on the thread then copies (NOTE [Transforms] in tracer/record/recorder.py).
- `node_sequence_nr(node)`, `input_metadata(node)`: a graph node's creation number and the metadata
  (shape, dtype) of its forward outputs, which the engine checks arriving gradients against; both
  declared on `torch.autograd.graph.Node`.
- `forward_class(node)`: the custom `autograd.Function` a `BackwardCFunction` node belongs to, or None.
- `saved_tensor_names(node)` / `saved_tensor(node, name)`: what autograd saved for a node's backward
  (its `_saved_*` attributes), read by the problem finder.
- `module_parameters(mod)` / `module_children(mod)` / `module_buffers(mod)`: an `nn.Module`'s own parameters,
  child modules and buffers (its `_parameters` / `_modules` / `_buffers` dicts, read without `named_*`'s generators);
  `module_forward_hooked(mod)`: whether it has forward hooks of its own (NOTE [Snapshot by forward] in replay.py).
- `post_accumulate_grad_hooks(param)`: the post-accumulate-grad hooks on a parameter, or None.
- `sparse_indices(t)` / `sparse_values(t)`: the stored indices and values of a coalesced COO tensor.
- `foreach_norm(tensors)`: the 2-norm of each tensor in one fused call (what `clip_grad_norm_` uses);
  the monitor's gradient norms (tracer/monitor/capture.py).
- `amp_unscale`: GradScaler's unscale op (`_amp_foreach_non_finite_check_and_unscale_`), which the
  monitor wraps (tracer/record/patched_calls.py).
- `reinsert_hook(handle, fn)`: put `fn` back into the hook dicts of a `RemovableHandle` that was
  removed, at the handle's own key (NOTE [Hooks under torch.compile] in tracer/record/global_hooks.py).
- `cxx11_abi`: the C++ string ABI torch was compiled with, which the native recorder must be built with
  too (tracer/record/native_build.py). The recorder's C++ itself uses torch's C++ autograd headers,
  which are as private: it is built against, and loaded only with, the very torch release it was built for.
"""

from __future__ import annotations

import operator
import os
import re
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

MIN_TORCH = (2, 9)  # the oldest torch gradscape supports: the floor of its tested range (NOTE [Torch floor])
MAX_TESTED = (2, 14)  # the newest release it is tested with; a newer one imports with one warning
# Set to 1 to import gradscape on an older torch anyway (each private name below is still looked up and
# a missing one still refused): for a machine whose torch cannot be replaced, such as a GPU image.
ALLOW_UNTESTED_ENV = "GRADSCAPE_ALLOW_UNTESTED_TORCH"
PRIVATE_NAMES: list[tuple[str, str]] = []  # (owner, name) of every private name looked up below


class UntestedTorchWarning(UserWarning):
    """torch is newer than the newest release gradscape is tested with (MAX_TESTED)."""


def tested_range() -> str:
    """The supported range as people write it, e.g. "2.9 to 2.14"."""
    return f"{MIN_TORCH[0]}.{MIN_TORCH[1]} to {MAX_TESTED[0]}.{MAX_TESTED[1]}"


def torch_version(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of a torch version string such as "2.13.0+cpu" (torch.__version__ by default)."""
    text = torch.__version__ if version is None else version
    m = re.match(r"(\d+)\.(\d+)", str(text))
    if m is None:
        raise ImportError(f"gradscape: cannot read the torch version {text!r}")
    return int(m.group(1)), int(m.group(2))


def check_torch(version: str | None = None) -> None:
    """Raise ImportError when torch is older than MIN_TORCH (unless GRADSCAPE_ALLOW_UNTESTED_TORCH=1);
    warn once (UntestedTorchWarning) when it is newer than MAX_TESTED."""
    text = torch.__version__ if version is None else version
    release = torch_version(version)
    if release < MIN_TORCH and os.environ.get(ALLOW_UNTESTED_ENV) != "1":
        raise ImportError(f"gradscape needs torch>={MIN_TORCH[0]}.{MIN_TORCH[1]} (it uses torch internals that "
                          f"older releases lack or spell differently); this is torch {text}. "
                          f"{ALLOW_UNTESTED_ENV}=1 tries it anyway, untested")
    if release > MAX_TESTED:
        warnings.warn(f"gradscape is tested with torch {tested_range()}; this is torch {text}, newer than that. "
                      f"It should work (every private name it uses was found); `gradscape doctor` says what runs",
                      UntestedTorchWarning, stacklevel=2)


def _private(owner: Any, owner_name: str, name: str) -> Any:
    if (owner_name, name) not in PRIVATE_NAMES:
        PRIVATE_NAMES.append((owner_name, name))
    try:
        return getattr(owner, name)
    except AttributeError:
        raise ImportError(f"gradscape: this torch ({torch.__version__}) has no {owner_name}.{name}, which gradscape "
                          f"uses; it is tested with torch {tested_range()}") from None


check_torch()

sequence_nr = _private(torch._C._autograd, "torch._C._autograd", "_get_sequence_nr")
DisableTorchFunction = _private(torch._C, "torch._C", "DisableTorchFunction")
push_mode = _private(torch._C, "torch._C", "_push_on_torch_function_stack")
pop_mode = _private(torch._C, "torch._C", "_pop_torch_function_stack")
mode_stack_len = _private(torch._C, "torch._C", "_len_torch_function_stack")
modes_enabled = _private(torch._C, "torch._C", "_is_torch_function_mode_enabled")  # False under DisableTorchFunction
mode_at = _private(torch._C, "torch._C", "_get_function_stack_at")
current_graph_task_id = _private(torch._C, "torch._C", "_current_graph_task_id")
set_grad_enabled = _private(torch._C, "torch._C", "_set_grad_enabled")
functorch_active = _private(torch._C, "torch._C", "_are_functorch_transforms_active")



def _check_nodes() -> None:
    """Autograd graph nodes' `_sequence_nr` and `_input_metadata`, looked up on each kind of node (an op's,
    an AccumulateGrad, a custom Function's): torch 2.13 declares both on `torch.autograd.graph.Node`, 2.9
    only on the concrete node classes."""

    class _Same(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: Any) -> Any:
            return t.clone()

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g

    # (gradscape may be imported under `no_grad` or `inference_mode`); the outputs are kept: a custom Function's
    # node is readable while its graph is
    with torch.inference_mode(False), torch.enable_grad():
        leaf = torch.zeros(1, requires_grad=True)
        outs = (leaf * 1, _Same.apply(leaf))
    op: Any = outs[0].grad_fn
    for node in (op, op.next_functions[0][0], outs[1].grad_fn):
        for name in ("_sequence_nr", "_input_metadata"):
            _private(node, "torch.autograd.graph.Node", name)


_check_nodes()
node_sequence_nr = operator.methodcaller("_sequence_nr")  # the cheapest call: it runs for every walked node


def input_metadata(node: Any) -> Any:
    return node._input_metadata


def forward_class(node: Any) -> Any:
    return getattr(type(node), "_forward_cls", None)


_SAVED, _RAW_SAVED = "_saved_", "_raw_saved_"


def saved_tensor_names(node: Any) -> tuple[str, ...]:
    """The names under which autograd saved tensors for this node's backward (without the `_saved_`
    prefix), one per `_raw_saved_*` attribute of the node's class."""
    return tuple(a[len(_RAW_SAVED):] for a in dir(node) if a.startswith(_RAW_SAVED))


def saved_tensor(node: Any, name: str) -> Any:
    """The value autograd saved as `name`; raises when it was freed or modified in place since."""
    return getattr(node, _SAVED + name)


# (attribute getters, C callables: a model's index reads them for every module at every traced step)
module_parameters: Callable[[Any], dict[str, Any]] = operator.attrgetter("_parameters")
# an `nn.Module`'s own buffers, as the dict it keeps them in (a replay swaps entries: tracer/record/replay.py)
module_buffers: Callable[[Any], dict[str, Any]] = operator.attrgetter("_buffers")
module_children: Callable[[Any], dict[str, Any]] = operator.attrgetter("_modules")


def module_forward_hooked(mod: Any) -> bool:
    """Whether an `nn.Module` has a forward hook or forward pre-hook of its own."""
    return bool(mod._forward_pre_hooks or mod._forward_hooks)


def post_accumulate_grad_hooks(param: Any) -> Any:
    return getattr(param, "_post_accumulate_grad_hooks", None)


foreach_norm = _private(torch, "torch", "_foreach_norm")
amp_unscale = _private(torch, "torch", "_amp_foreach_non_finite_check_and_unscale_")
sparse_indices = _private(torch.Tensor, "torch.Tensor", "_indices")
sparse_values = _private(torch.Tensor, "torch.Tensor", "_values")
cxx11_abi = bool(_private(torch._C, "torch._C", "_GLIBCXX_USE_CXX11_ABI"))


# The code of `nn.Module._call_impl`, the frame between a module's `__call__` and its `forward`
# (NOTE [Direct forward calls] in tracer/record/sources.py)
module_call_code = _private(torch.nn.Module, "torch.nn.Module", "_call_impl").__code__

# NOTE [Hooks under torch.compile] (tracer/record/global_hooks.py): `OptimizedModule.__call__` warns
# while `torch.nn.modules.module._has_any_global_hook()` is true, looking the function up at each call.
_nn_module = torch.nn.modules.module
_GLOBAL_HOOK_DICTS = ("_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_pre_hooks",
                      "_global_forward_hooks", "_global_forward_hooks_always_called",
                      "_global_forward_hooks_with_kwargs")


def global_module_hook_keys() -> list[Any]:
    """The keys of every global module hook dict (what `_has_any_global_hook` looks at)."""
    return [k for name in _GLOBAL_HOOK_DICTS for k in getattr(_nn_module, name, {})]


def global_hook_check() -> Any:
    """torch's `_has_any_global_hook` as it stands now, or None where this torch has none."""
    return getattr(_nn_module, "_has_any_global_hook", None)


def set_global_hook_check(fn: Any) -> None:
    _nn_module._has_any_global_hook = fn


def reinsert_hook(handle: Any, fn: Any, first: bool = False) -> bool:
    """Put `fn` back at `handle`'s key in the hook dict it was registered in (and, for an `always_call`
    hook, mark it so again), last, or `first` (as `prepend=True` registers). False when that dict is gone:
    register anew then."""
    hooks = handle.hooks_dict_ref()
    if hooks is None:
        return False
    hooks[handle.id] = fn
    if first:
        hooks.move_to_end(handle.id, last=False)
    for ref in handle.extra_dict_ref:  # `always_call`: the same key in a second dict
        extra = ref()
        if extra is not None:
            extra[handle.id] = True
    return True


def _check_handle() -> None:
    from collections import OrderedDict

    from torch.utils.hooks import RemovableHandle

    handle = RemovableHandle(OrderedDict())  # the kind of dict torch keeps hooks in (weakly referenced)
    for name in ("hooks_dict_ref", "extra_dict_ref", "id"):
        _private(handle, "torch.utils.hooks.RemovableHandle", name)


_check_handle()


# NOTE [Compiled regions on a traced step] (tracer/record/compiled.py): gradscape never imports dynamo itself
# (torch imports it with the first optimizer made, 2.13). Each compiled callable's wrapper asks
# `torch._dynamo.eval_frame._callback_from_stance(callback)` (looked up at each call) which frame callback
# to run its function under: under the stance "force_eager" it answers None, and the function runs eagerly.
def dynamo_loaded() -> bool:
    """torch._dynamo is imported: something in this process may have compiled (`torch.compile` imports it)."""
    return "torch._dynamo" in sys.modules


_STANCE: list[Any] = []  # [eval_frame, "force_eager", its frame-callback getter], or [None]: found once


def _stance_parts() -> list[Any]:
    if not _STANCE:
        from torch._dynamo import eval_frame

        try:
            from torch._C._dynamo.eval_frame import get_eval_frame_callback

            _STANCE.extend((eval_frame, eval_frame.DynamoStance("force_eager"), get_eval_frame_callback))
            eval_frame._stance  # noqa: B018 (the global `_set_stance` swaps)
        except (ImportError, AttributeError, TypeError):  # another torch: its public context (below)
            _STANCE[:] = [None]
    return _STANCE


def force_eager() -> Any:
    """Set dynamo's stance to "force_eager" and return what puts it back (for `put_stance`): what
    `torch.compiler.set_stance("force_eager")` does on entering (`eval_frame._set_stance`, torch 2.9 to 2.14),
    without its context object and the import its function runs at every call (1.4 µs of its 1.5); that
    context itself on a torch without those names. `RuntimeError` inside a compiled region, as there."""
    parts = _stance_parts()
    if parts[0] is None:
        return torch.compiler.set_stance("force_eager")
    eval_frame, stance, callback = parts
    cb = callback()
    if cb is not False and cb is not None:
        raise RuntimeError("attempted to set_stance in a torch.compile region")
    prior = eval_frame._stance
    eval_frame._stance = stance
    return prior


def put_stance(prior: Any) -> None:
    """Put back the stance `force_eager` replaced."""
    parts = _stance_parts()
    if parts[0] is None:
        prior.__exit__(None, None, None)
    else:
        parts[0]._stance = prior


def compiled_anything() -> bool:
    """A compiled callable was made in this process (`torch.compile`, `module.compile()`): dynamo keeps each
    one's backend (`eval_frame.cached_backends`, torch 2.9 to 2.14; `torch.compiler.disable` keeps None there)
    until `torch._dynamo.reset()`. True where this torch keeps no such table."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return False
    backends = getattr(eval_frame, "cached_backends", None)
    return not isinstance(backends, dict) or any(b is not None for b in backends.values())


def compiled_entries(on_entry: Any) -> Any:
    """Call `on_entry()` each time a compiled callable is entered, until the returned function is called
    (it puts dynamo's own back). None where this torch has no `_callback_from_stance`."""
    from torch._dynamo import eval_frame

    original = getattr(eval_frame, "_callback_from_stance", None)
    if original is None:
        return None

    def watched(callback: Any) -> Any:
        if callback is not None and callback is not False:  # a compile context (not disable / run-only)
            on_entry()
        return original(callback)

    eval_frame._callback_from_stance = watched

    def undo() -> None:
        if eval_frame._callback_from_stance is watched:  # put back only what is still ours
            eval_frame._callback_from_stance = original

    return undo


def compiled_wrapper_inner(mod: Any) -> Any:
    """The module a `torch.compile(module)` wrapper (`OptimizedModule`) compiles, or None for any other module."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # (no such wrapper before dynamo is imported)
    if eval_frame is None:
        return None
    return mod._orig_mod if isinstance(mod, eval_frame.OptimizedModule) else None
