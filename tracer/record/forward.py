"""Forward-time attribution: which module and which line of user code created each grad_fn node.

NOTE [Attribution by sequence window]
    Autograd numbers nodes with a per-thread creation counter (`Node._sequence_nr()`). A global
    module forward pre-hook notes the counter when a module starts and the post-hook when it ends:
    the call created exactly the nodes numbered in [lo, hi). Windows nest like the calls, so a node
    belongs to the innermost window that holds its number (ops written directly in a parent's
    forward get the parent's name). The hooks only note two integers and the gradient edges of the
    call's inputs and outputs; names are given to nodes once, after the step (`modules_of`).
    AccumulateGrad nodes carry the largest counter value and fall in no window. A `forward` called
    directly (`layer.forward(x)`) fires no hook and opens no window: the function mode finds its
    module from the op's frames instead (NOTE [Direct forward calls] in tracer/record/sources.py).

NOTE [Source lines]
    A `TorchFunctionMode`, active only inside `Tracer.step`, sees every top-level torch call of the
    step. When a call moved the sequence counter, the first frame outside torch and gradscape is the
    user's line, recorded for that counter range. The same mode intercepts `Tensor.backward` and
    `torch.autograd.grad`, and `torch.autograd.backward` where it honours `__torch_function__` (elsewhere
    NOTE [Backward by name] in backward_by_name.py): that is how the tracer learns the roots of a backward
    before it runs (no user call needed). A carried step, without the mode, learns them through the
    wrappers (NOTE [Patched backward] in patched_calls.py).
    Inside a handler the mode is off, so our own torch calls (statistics in hooks) never re-enter it.

NOTE [Library leaves]
    Inside a module with no children whose forward is torch's own code (nn.Conv2d, nn.ReLU,
    nn.Linear, nn.LayerNorm, ...), every frame between an op and the user's code is torch's, so the
    first frame outside torch is the same for all of the call's ops: the line that called the module.
    For such a call the module pre-hook takes the mode off the stack (when it is on top) and the
    post-hook puts it back and records that line once for the call's whole sequence window. The
    result is the line the mode would have recorded per op, without the mode's dispatch per op (a
    Python call per op, dearer inside a real step, where the kernels around it have evicted the
    interpreter's caches). The post-hook is registered with
    `always_call=True`, so a forward that raises puts the mode back too.

Both the hooks and the mode are removed when the step ends, also when it raises (through the step's
`StepHandles`, tracer/record/handles.py). Forward hooks that fire during backward (non-reentrant
checkpoint recomputes forwards) are ignored. The global hooks themselves, shared by every open step
block, are in tracer/record/global_hooks.py; which frame is the user's, in tracer/record/sources.py.
"""

from __future__ import annotations

import bisect
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from gradscape.tracer import _compat
from gradscape.tracer.record import backward_by_name, global_hooks
from gradscape.tracer.record.global_hooks import compiling as _compiling
from gradscape.tracer.record.patched_calls import original_of
from gradscape.tracer.record.sources import ForwardFrames, is_library_leaf, user_frame

_seqnr = _compat.sequence_nr
_NoTorchFunction = _compat.DisableTorchFunction
_push_mode = _compat.push_mode  # what TorchFunctionMode.__enter__ / __exit__ do
_pop_mode = _compat.pop_mode
_stack_len = _compat.mode_stack_len
_mode_at = _compat.mode_at
_graph_task = _compat.current_graph_task_id
_get_ident = threading.get_ident
_getframe = sys._getframe
_Tensor = torch.Tensor
_module_children = _compat.module_children


def _remove_mode(mode: Any) -> None:
    """Take `mode` off this thread's function-mode stack wherever it is, leaving the modes above it in
    place: another tracer's step block opened inside ours may still be open when ours ends."""
    above = []
    while _compat.mode_stack_len():
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        _push_mode(m)


def _is_compiling() -> bool:
    return bool(_compiling())


def gradient_edge(t: Any) -> tuple[Any, int] | None:
    """(node, output_nr) that will receive ∂L/∂t, or None when t needs no gradient.
    Call with torch functions disabled (property reads would otherwise go through our own mode)."""
    if not isinstance(t, torch.Tensor) or not t.requires_grad:
        return None
    fn = t.grad_fn
    if fn is not None:
        return (fn, t.output_nr)
    edge = torch.autograd.graph.get_gradient_edge(t)  # a leaf: its AccumulateGrad node
    return (edge.node, edge.output_nr)


@dataclass(slots=True)
class ModuleCallRecord:
    name: str
    lo: int  # sequence window [lo, hi) of the nodes this call created
    hi: int
    inputs: list[tuple[Any, int] | None]
    outputs: list[tuple[Any, int] | None]


@dataclass
class ForwardRecorder:
    """Global module forward hooks + a step-scoped TorchFunctionMode. See the NOTEs above."""

    module_names: dict[Any, str]
    on_backward: Callable[..., Any]
    calls: list[ModuleCallRecord] = field(default_factory=list)
    _stack: list[tuple[Any, int, list[tuple[Any, int] | None]]] = field(default_factory=list)
    _src_lo: list[int] = field(default_factory=list)
    _src_hi: list[int] = field(default_factory=list)
    _src: list[str | None] = field(default_factory=list)
    _src_mod: list[str | None] = field(default_factory=list)  # the module whose forward ran the op, when seen
    _mode: Any = None
    seq0: int = 0  # the creation counter when the step began
    recorded: bool = False  # `start` ran with the hooks and the mode: this forward's attribution is its own
    carried: bool = False  # `start` ran without them (NOTE [Carried forwards] in tracer/record/carry.py)
    _paused: bool = False  # the mode is off the stack (NOTE [Optimizer steps], NOTE [Library leaves])
    _leaf: Any = None  # the library leaf module whose call took the mode off the stack
    _leaf_lo: int = 0  # the sequence number when that call started
    _thread: int = 0  # the thread whose function-mode stack holds the mode
    on_detach: Callable[[Any, Any], None] | None = None  # problem finder: (tensor, caller frame) of a detach
    on_no_grad: Callable[[Any, Any], None] | None = None  # problem finder: (args, caller frame) of an op in no_grad
    on_module_out: Callable[[Any, str], None] | None = None  # (module, its name) as a model module's forward ends
    # NOTE [Direct forward calls] in tracer/record/sources.py: made at the first source line noted (a carried
    # forward notes none: NOTE [Carried forwards] in tracer/record/carry.py)
    _frames: ForwardFrames | None = None

    def start(self, carried: bool = False) -> None:
        """The module hooks and the mode; none of them for a `carried` step, whose forward's attribution
        comes from an earlier step (NOTE [Carried forwards] in tracer/record/carry.py)."""
        self.seq0 = _seqnr()
        self.recorded, self.carried = not carried, carried
        if carried:
            return
        global_hooks.add(self)
        if self._mode is None:  # (one hold on the engine's wrapper per mode, released by `stop`)
            backward_by_name.acquire(_StepMode)  # (NOTE [Backward by name])
        self._mode = _StepMode(self)
        self._thread = threading.get_ident()  # the mode is on this thread's stack, and only there
        _push_mode(self._mode)

    def stop(self) -> None:
        """Idempotent; safe to call from a `finally`."""
        global_hooks.discard(self)
        mode, self._mode = self._mode, None
        if mode is not None:
            backward_by_name.release()
            if not self._paused:
                _remove_mode(mode)
        self._paused = False
        self._leaf = None
        self._stack.clear()
        if self._frames is not None:
            self._frames.release()

    # ---- stepping aside
    # NOTE [Optimizer steps]: an `optimizer.step()` inside the block makes dozens
    # of torch calls (a `.grad` read, an update per parameter) that create no graph node under the
    # usual no_grad, yet each would go through the mode's Python handler (~2 µs apiece: a tenth of
    # the tracer's whole cost on a small CNN). The mode leaves the stack for the step and comes back
    # after it, only when it is on top (a user's mode above it stays as it is) and not for a
    # `differentiable` optimizer, whose step builds graph nodes that deserve source lines. If a step
    # raises, the next module call outside backward puts the mode back. NOTE [Library leaves] is the
    # same for a module call.
    def _step_aside(self) -> bool:
        """Take the mode off the stack when it is on top; True if it was."""
        mode = self._mode
        n = _stack_len()
        if mode is not None and n and _mode_at(n - 1) is mode:
            _pop_mode()
            self._paused = True
            return True
        return False

    def optimizer_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not self._paused and not _is_compiling() and not opt.defaults.get("differentiable"):
            self._step_aside()
        return None

    def optimizer_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self._leaf is None:
            self._resume()
        return None

    def _resume(self) -> None:
        if self._paused and self._mode is not None:
            self._paused = False
            _push_mode(self._mode)

    # ---- module hooks (must return None: a value would replace the module's output) ----
    # Called from `_on_pre` / `_on_post` (tracer/record/global_hooks.py), which return at once while
    # dynamo compiles. They run for every module call of a traced forward, so they are written for
    # speed (module-level names for torch's functions, no check that the caller made already).
    def module_pre(self, mod: Any, args: Any) -> None:
        if _graph_task() != -1:  # a forward recomputed inside backward (checkpoint)
            return None
        paused = self._paused
        if paused and self._leaf is None and _get_ident() == self._thread:
            self._resume()  # an optimizer step raised before its post-hook could put the mode back
            paused = False
        if mod in self.module_names:  # a module of the model: its call is recorded
            with _NoTorchFunction():
                edges = [gradient_edge(a) for a in args]
            self._stack.append((mod, _seqnr(), edges))
        # NOTE [Library leaves], for any module (a loss too)
        if not paused and not _module_children(mod) and is_library_leaf(type(mod)) and self._step_aside():
            self._leaf = mod
            self._leaf_lo = _seqnr()
            if self.on_no_grad is not None and not _grad_enabled():  # its ops go unseen: its parameters
                self.on_no_grad(tuple(_compat.module_parameters(mod).values()), _getframe(1))
        return None

    def module_post(self, mod: Any, args: Any, out: Any) -> None:
        # registered with always_call=True: also runs when the forward raised (then `out` is None)
        if _graph_task() != -1:
            return None
        name = self.module_names.get(mod)
        if self._leaf is mod:
            self._leaf = None
            self._resume()
            lo, hi = self._leaf_lo, _seqnr()
            if hi != lo:  # the frame above global_hooks._on_post: the leaf's own `_call_impl`
                self.note_source(lo, hi, _getframe(2), name)
        if name is None:
            return None
        if self.on_module_out is not None:
            self.on_module_out(mod, name)
        # pop this module's frame (frames above it belong to calls that raised)
        stack = self._stack
        while stack and stack[-1][0] is not mod:
            stack.pop()
        if not stack:
            return None
        _, lo, inputs = stack.pop()
        hi = _seqnr()
        outs = (out,) if isinstance(out, _Tensor) else out if isinstance(out, (tuple, list)) else ()
        with _NoTorchFunction():
            edges = [gradient_edge(o) for o in outs]
        self.calls.append(ModuleCallRecord(name, lo, hi, inputs, edges))
        return None

    def modules_of(self, seqs: Any) -> list[str | None]:
        """The qualified name of the module whose forward created each node (by its sequence number: a
        list or an array), None outside every module call. See NOTE [Attribution by sequence window]."""
        seq = np.asarray(seqs, dtype=np.uint64)
        order = np.argsort(seq, kind="stable")
        ordered = seq[order]
        named = np.full(len(seq), None, dtype=object)  # in sequence order
        # outer calls first, so that the inner calls they contain overwrite them. A wrapper whose
        # forward only calls the wrapped module has the very same window as that call; calls are
        # recorded as they end, innermost first, so among equal windows the later record is outer.
        calls = self.calls
        if calls:
            a = np.searchsorted(ordered, np.array([c.lo for c in calls], np.uint64), "left").tolist()
            b = np.searchsorted(ordered, np.array([c.hi for c in calls], np.uint64), "left").tolist()
            for i in sorted(range(len(calls)), key=lambda i: (calls[i].lo, -calls[i].hi, -i)):
                if a[i] < b[i]:
                    named[a[i]:b[i]] = calls[i].name
        out = np.empty(len(seq), dtype=object)
        out[order] = named
        # an op the mode saw in the forward of a model module belongs to it (NOTE [Direct forward calls])
        mods = self._src_mod
        if any(m is not None for m in mods):
            lo = np.asarray(self._src_lo, dtype=np.uint64)
            hi = np.asarray(self._src_hi, dtype=np.uint64)
            at = np.searchsorted(lo, seq, "right") - 1  # the source window each node's number falls in
            mod_arr = np.array(mods, dtype=object)
            ok = at >= 0
            ok[ok] = seq[ok] < hi[at[ok]]
            ok[ok] = mod_arr[at[ok]] != None  # noqa: E711 (elementwise on an object array)
            out[ok] = mod_arr[at[ok]]
        return out.tolist()  # type: ignore[no-any-return]

    # ---- source lines ----
    def note_source(self, lo: int, hi: int, frame: Any, module: str | None = None) -> None:
        """The nodes numbered [lo, hi) were made from `frame`: the user's line, and the model module whose
        forward ran there (`module` when the caller knows it, a library leaf of the model)."""
        self._src_lo.append(lo)
        self._src_hi.append(hi)
        if module is None:
            if self._frames is None:
                self._frames = ForwardFrames(self.module_names)
            src, module = self._frames.locate(frame)
        else:
            src = user_frame(frame)
        self._src.append(src)
        self._src_mod.append(module)

    def sources_of(self, seqs: Any) -> list[str | None]:
        """`source_of` for each of `seqs` (an array of sequence numbers)."""
        lo = np.asarray(self._src_lo, dtype=np.uint64)
        if not len(lo):
            return [None] * len(seqs)
        hi = np.asarray(self._src_hi, dtype=np.uint64)
        i = np.searchsorted(lo, seqs, side="right").astype(np.int64) - 1
        ok = (i >= 0) & (seqs < hi[np.maximum(i, 0)])
        src = self._src
        return [src[k] if good else None for k, good in zip(i.tolist(), ok.tolist())]

    def source_of(self, seq: int) -> str | None:
        i = bisect.bisect_right(self._src_lo, seq) - 1
        if i >= 0 and seq < self._src_hi[i]:
            return self._src[i]
        return None



_DETACH = (torch.Tensor.detach, torch.detach)  # noted for the problem finder (a cut in the graph)
_grad_enabled = torch.is_grad_enabled
_BACKWARD_FUNCS = {torch.Tensor.backward: "Tensor.backward",
                   torch.autograd.backward: "autograd.backward",
                   torch.autograd.grad: "autograd.grad"}


class _StepMode(TorchFunctionMode):
    def __init__(self, recorder: ForwardRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if _compiling():  # dynamo traces this handler: keep it trivially traceable
            return func(*args, **kwargs)
        api = _BACKWARD_FUNCS.get(func)
        if api is None and (orig := original_of(func)) is not func:  # NOTE [Patched backward]
            func, api = orig, _BACKWARD_FUNCS.get(orig)
        if api is not None:
            return self.recorder.on_backward(api, func, args, kwargs)
        if func in _DETACH and self.recorder.on_detach is not None and args:  # problem finder: a graph cut
            self.recorder.on_detach(args[0], sys._getframe(1))
        if not _grad_enabled() and self.recorder.on_no_grad is not None:  # problem finder: an op under no_grad
            self.recorder.on_no_grad(args, sys._getframe(1))
        before = _seqnr()
        out = func(*args, **kwargs)
        after = _seqnr()
        if after != before:
            self.recorder.note_source(before, after, sys._getframe(1))
        return out
