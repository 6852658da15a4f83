"""A loss-triggered step replayed: the model's forward and backward run again, eagerly and traced, from the
state the forward started from, before the step's own backward runs as training's.

NOTE [Replayed loss triggers]
    A `nonfinite` or `loss_spike` trigger (NOTE [Trigger rules] in tracer/monitor/triggers.py) fires when the
    backward starts: the forward has run untraced (compiled, for a compiled model), so tracing that backward
    alone gives no forward attribution and, under torch.compile, one node for the whole region. So on every
    monitored block the Tracer's model's calls are kept (`ForwardSnapshot`: its forward wrapped, or a
    forward pre-hook and a forward hook, put on as the block opens and taken off as it ends; see
    NOTE [Snapshot by forward]): at each call of the model its arguments, the random generators' states
    and copies of its buffers (`TrainingState`, the same as compare.py's), and its output. When a loss
    trigger fires at a backward, before that backward runs:
      1. the gradient the step's own graph gives the model's outputs is taken (`torch.autograd.grad` from
         the backward's roots to those outputs, keeping the graph): the seed of the replayed backward;
      2. the state after the forward is kept, each parameter's `.grad` set aside, and the state taken
         before the forward put back;
      3. the model is called again on the same arguments, eagerly (NOTE [Compiled regions on a traced
         step] in compiled.py) and under the trigger's trace (its forward recorder, hooks and mode), and
         the backward runs from its outputs with that seed: the trace of the step is the replay's;
      4. the state after the forward and each `.grad` are put back, and the step's own backward runs
         untraced, as training's (compiled, for a compiled model).
    Training is unchanged: its generators, buffers, gradients and optimizer see what they would without
    gradscape (tests/test_replay.py trains a twin). `st.meta["replay"]` says what was replayed, or why the
    trigger's trace is the backward alone: no call of the model seen in the block (`model.compile()`
    compiles the model's hooks in with it, where hooks added later never run), a backward from
    `torch.autograd.grad` or a `GradientEdge`, outputs the loss does not depend on, torch.distributed (the
    replay's backward would run DDP's or FSDP's collectives on one rank alone), or an error in the replay.
    The replay's forward runs the model's code once more: a forward with side effects of its own (a
    counter, a print, a Python list it appends to) does them twice.

NOTE [Snapshot hooks]
    A model may be called inside a compiled function (Lightning compiles `training_step`, which calls
    the module). Dynamo then inlines the module's hooks and guards on their keys in the module's hook
    dicts: hooks registered anew at each block would fail those guards at each step, a recompile each
    time (as NOTE [Hooks under torch.compile] in global_hooks.py found for the global hooks). So the two
    hooks are the same function objects every time, put back at the keys of their first registration
    (`_compat.reinsert_hook`), and while dynamo traces them they return at once: a compiled function's
    graph holds nothing of theirs, and its guards hold at every monitored step. Such a model's calls are
    not kept (it runs compiled), and its loss triggers trace the backward alone, saying why.

NOTE [Snapshot by forward]
    A module with a forward hook of any kind is called through `nn.Module._call_impl`'s slow path, which
    costs far more than the hook itself: measured on actor-critic (bench/workloads.py W7, the model called
    10 times a step), two empty hooks cost 80–110 µs a 3.4 ms step, where the same calls through a
    wrapped `forward` cost about 20. So where nothing could tell the difference the block keeps the calls by
    setting the instance's `forward` to the class's, wrapped (`_forward_of`: one function bound to the model,
    the same object at every install, so a compiled caller's guards hold as for the hooks, NOTE [Snapshot
    hooks]), and deletes it as the block ends (no attribute is left: tests/test_side_effects.py). A wrapped
    forward sees the arguments after any forward pre-hook changed them and the output before any forward
    hook did, where a replay's call runs those hooks again; so a model with a forward hook of its own or a
    global one, or a `forward` of the instance's own, is kept by the two hooks instead: the pre-hook put
    first and the hook last, so they see the call as the program made it (tests/test_replay.py replays a
    model whose hooks change both, and compares each gradient with training's).

NOTE [Snapshots on the CPU only]
    A loss trigger fires inside the block only where the loss is read as the backward starts: on the CPU
    (`_check_loss` in tracer/monitor/capture.py). A loss on another device is read after the step, and the
    step after it is traced instead, so nothing the snapshot keeps is ever replayed there. So a model whose
    parameters are not on the CPU (one of them is looked at, each call) keeps only its call count: no
    generator state is read and no buffer copied (a CUDA ResNet-50 would copy its 159 buffers, a kernel
    launch each, at every monitored step). Should such a model's loss still reach a backward on the CPU
    (`loss.cpu().backward()`), the trigger's trace is the backward alone and says why. Each call's snapshot
    is timed (`spent`): the monitor counts it as its own cost (NOTE [Sampled norms] in
    tracer/monitor/sampling.py).
"""

from __future__ import annotations

import functools
import logging
import types
import weakref
from time import perf_counter
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer.record import patched_calls
from gradscape.tracer.record.compare import TrainingState
from gradscape.tracer.record.compiled import EagerRegions
from gradscape.tracer.record.global_hooks import compiling
from gradscape.tracer.record.handles import CallOnRemove
from gradscape.tracer.record.model_index import ModelIndex

log = logging.getLogger(__name__)


class ForwardSnapshot:
    """The Tracer's model's latest call in the open block, and the state it started from."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.handles: list[Any] = []  # the first registrations', whose keys every later install reuses
        self.installed = False
        self.off = False  # while a replay calls the model
        self._hooks = _hooks_of(weakref.ref(self))  # the same functions at every install (NOTE [Snapshot hooks])
        self._forward: Any = None  # the model's forward wrapped, bound to it: the same at every install
        self.wrapped = False  # this install keeps calls through `_forward`, not the hooks
        self.buffers: list[torch.Tensor] | None = None  # the model's, listed at its first call (walking it costs)
        # one of its parameters, listed with the buffers: where it runs (NOTE [Snapshots on the CPU only])
        self.probe: torch.Tensor | None = None
        self.spent = 0.0  # seconds spent keeping calls, summed (the monitor reads the difference each block)
        self.clear()

    def clear(self) -> None:
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.state: TrainingState | None = None
        self.outputs: Any = None
        self.calls = 0  # calls of the model since the last backward
        self.elsewhere = False  # the latest call ran off the CPU: nothing kept (NOTE [Snapshots on the CPU only])

    def install(self) -> None:
        model = self.model
        if getattr(model, "_compiled_call_impl", None) is not None or _distributed():
            return  # model.compile(): hooks compiled in; torch.distributed: never replayed
        if _wrappable(model):  # NOTE [Snapshot by forward]
            if self._forward is None:
                self._forward = types.MethodType(_forward_of(weakref.ref(self), type(model).forward), model)
            vars(model)["forward"] = self._forward  # (what `nn.Module.__setattr__` does with a method, less its checks)
            self.installed = self.wrapped = True
            return
        pre, post = self._hooks
        # the pre-hook first, the hook last: they see the call's arguments and output as the program passed and
        # got them, before the model's own hooks changed them, as a replay's call will run them
        if self.handles and all(_compat.reinsert_hook(h, fn, first) for h, fn, first in
                                zip(self.handles, self._hooks, (True, False))):
            self.installed = True
            return
        self.handles = [self.model.register_forward_pre_hook(pre, with_kwargs=True, prepend=True),
                        self.model.register_forward_hook(post, with_kwargs=True, always_call=True)]
        self.installed = True

    def remove(self) -> None:
        if self.installed and self.wrapped:
            own = vars(self.model)
            if own.get("forward") is self._forward:  # (not if the program set its own since)
                del own["forward"]
        elif self.installed:
            for h in self.handles:
                h.remove()
        self.installed = self.wrapped = False
        self.clear()

    def on_pre(self, mod: Any, args: Any, kwargs: Any) -> bool:
        """Keep a call's arguments and the state it starts from: True when its outputs are to be kept too."""
        if self.off or _compat.current_graph_task_id() != -1:  # (a forward recomputed in backward)
            return False
        t0 = perf_counter()
        self.calls += 1
        if self.buffers is None:
            self.buffers = list(mod.buffers())
            self.probe = next(iter(mod.parameters()), None)
        probe = self.probe
        if probe is not None and not probe.is_cpu:  # `is_cpu`: no device object made
            self.elsewhere = True  # never replayed (NOTE [Snapshots on the CPU only])
            self.args, self.kwargs, self.state, self.outputs = (), {}, None, None
        else:
            self.elsewhere = False
            self.args, self.kwargs, self.state, self.outputs = args, kwargs, TrainingState(self.buffers), None
        self.spent += perf_counter() - t0
        return not self.elsewhere

    def on_post(self, mod: Any, args: Any, kwargs: Any, out: Any) -> None:
        if not self.off and not self.elsewhere and _compat.current_graph_task_id() == -1:
            self.outputs = out
        return None


def _wrappable(model: torch.nn.Module) -> bool:
    """Whether the model's calls can be kept by wrapping its forward (NOTE [Snapshot by forward]): its class's
    own function, no forward of the instance's and no forward hook, its own or global, that could change
    the arguments or the output."""
    return (isinstance(getattr(type(model), "forward", None), types.FunctionType) and "forward" not in vars(model)
            and not _compat.module_forward_hooked(model) and not _compat.global_module_hook_keys())


def _forward_of(ref: Any, forward: Any) -> Any:
    """The class's `forward` wrapped to keep the model's calls, holding the snapshot weakly; inert while dynamo
    traces it and for any other module (a `copy.deepcopy` of the model made in the block is bound to it)."""

    def kept(mod: Any, *args: Any, **kwargs: Any) -> Any:
        if compiling():
            return forward(mod, *args, **kwargs)
        snap = ref()
        if snap is None or mod is not snap.model:
            return forward(mod, *args, **kwargs)
        if not snap.on_pre(mod, args, kwargs):
            return forward(mod, *args, **kwargs)
        out = snap.outputs = forward(mod, *args, **kwargs)
        return out

    return functools.update_wrapper(kept, forward)  # `inspect.signature(model.forward)` reads the model's own


def _hooks_of(ref: Any) -> tuple[Any, Any]:
    """The snapshot's two hooks, holding it weakly (it holds them: a cycle would keep a dropped Tracer's model
    alive until the cyclic collector ran), and inert while dynamo traces them (NOTE [Snapshot hooks])."""

    def pre(mod: Any, args: Any, kwargs: Any) -> None:
        if compiling():
            return None
        snap = ref()
        if snap is not None and mod is snap.model:  # (not a `copy.deepcopy` of the model, with these hooks)
            snap.on_pre(mod, args, kwargs)
        return None

    def post(mod: Any, args: Any, kwargs: Any, out: Any) -> None:
        if compiling():
            return None
        snap = ref()
        if snap is not None and mod is snap.model:
            snap.on_post(mod, args, kwargs, out)
        return None

    return pre, post


class Replayable:
    """A monitored block with the model's calls kept for a replay: the snapshot's hooks while it is open."""

    def __init__(self, inner: Any, snapshot: ForwardSnapshot) -> None:
        self.inner, self.snapshot = inner, snapshot

    def __enter__(self) -> Any:
        self.snapshot.install()
        try:
            return self.inner.__enter__()
        except BaseException:
            self.snapshot.remove()
            raise

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.inner.__exit__(*exc)
        finally:
            self.snapshot.remove()


class BufferSwap:
    """The model's buffers replaced by copies of their values before the forward, for the replay; `undo` puts
    the very tensors back. Not copied back in place: the step's own graph may have saved a buffer for its
    backward (BatchNorm's statistics), whose version an in-place copy would change."""

    def __init__(self, model: torch.nn.Module, saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        copies = {id(b): c for b, c in saved}
        self.undone: list[tuple[dict[str, Any], str, torch.Tensor]] = []
        self.unknown = False  # a buffer with no copy: the replay would change it, so it is not run
        for mod in model.modules():
            bufs = _compat.module_buffers(mod)
            for name, b in list(bufs.items()):
                if b is not None and id(b) in copies:
                    self.undone.append((bufs, name, b))
                    bufs[name] = copies[id(b)].clone()
                elif b is not None:
                    self.unknown = True

    def undo(self) -> None:
        for bufs, name, b in self.undone:
            bufs[name] = b
        self.undone = []


def _distributed() -> bool:
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized())


def _roots(api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], list[Any]] | None:
    """The tensors and gradients a `Tensor.backward` / `torch.autograd.backward` call starts from."""
    if api == "Tensor.backward":
        return [args[0]], [kwargs.get("gradient", args[1] if len(args) > 1 else None)]
    if api != "autograd.backward":
        return None
    first = args[0] if args else kwargs.get("tensors")
    grads = kwargs.get("grad_tensors", args[1] if len(args) > 1 else None)
    tensors = [first] if isinstance(first, torch.Tensor) else list(first or ())
    grads = [grads] if isinstance(grads, torch.Tensor) or grads is None else list(grads)
    if any(not isinstance(t, torch.Tensor) for t in tensors):
        return None  # a GradientEdge root: no value to start from
    return tensors, (grads + [None] * len(tensors))[:len(tensors)]


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _tensors(o)]
    return []


def replay(ts: Any, snap: ForwardSnapshot, api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Replay the model's latest call into the trigger's trace `ts` (NOTE [Replayed loss triggers]; a
    `_TracedStep`); None when done, else why not (the step's own backward is then traced as before)."""
    roots = _roots(api, args, kwargs)
    if _distributed():
        return "not under torch.distributed: the replay's backward would run the collectives on this rank alone"
    if snap.elsewhere and snap.probe is not None:  # (`elsewhere` is only ever set from a probe)
        return (f"the model runs on {snap.probe.device.type}, where a loss is read after the step: its calls "
                "are not kept for a replay (NOTE [Snapshots on the CPU only])")
    if snap.state is None or snap.outputs is None:
        return ("no call of the model was seen in the block: a model called inside a compiled function (or "
                "model.compile()d) runs without the snapshot's hooks")
    if roots is None:
        return f"a backward from {api} with a GradientEdge or from autograd.grad is not replayed"
    outs = [o for o in _tensors(snap.outputs) if o.requires_grad]
    if not outs:
        return "the model's outputs need no gradient"
    with _compat.DisableTorchFunction():
        seeds = torch.autograd.grad(roots[0], outs, grad_outputs=roots[1], retain_graph=True, allow_unused=True)
    if all(g is None for g in seeds):
        return "the loss does not depend on the model's latest call"
    model, before = snap.model, snap.state
    swapped = BufferSwap(model, before.buffers)
    if swapped.unknown:
        swapped.undo()
        snap.buffers = None  # listed again at the next call
        return "a buffer was registered after the model's first call in a monitored step"
    after_rng = TrainingState()
    named = ModelIndex(model).params
    held = [p.grad for p, _ in named]
    for p, _ in named:
        p.grad = None
    regions = EagerRegions()
    rec = ts.rec
    snap.off = True
    try:
        before.restore_rng()
        rec.handles.add(CallOnRemove(rec.forward.stop))
        rec.collector.pause()
        rec.forward.start(carried=False)  # the mode and the module hooks: the replay's forward attributed
        regions.start()
        try:
            new = [o for o in _tensors(model(*snap.args, **snap.kwargs)) if o.requires_grad]
            pairs = [(o, g) for o, g in zip(new, seeds) if g is not None]
            # handed to the recorder itself, not through the mode: torch 2.9's `autograd.backward` reaches no
            # torch-function mode, and the monitor's wrapper of it is the one running this replay
            with _compat.DisableTorchFunction():
                rec._on_backward("autograd.backward", patched_calls.original_of(torch.autograd.backward),
                                 ([o for o, _ in pairs], [g for _, g in pairs]), {})
        finally:
            regions.stop()
            rec.forward.stop()  # the step's own backward is training's: not recorded
    finally:
        snap.off = False
        swapped.undo()
        after_rng.restore_rng()
        for (p, _), g in zip(named, held):
            p.grad = g
    ts.regions = regions
    ts.replayed = {"forward": "replayed", "calls": snap.calls, "outputs": len(pairs)}
    return None


def replay_trigger(tracer: Any, ts: Any, api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The monitor's call as a loss trigger's trace `ts` starts at a backward: True when the replay is the
    trace (the backward then runs untraced), False when the backward itself is to be traced; either way
    `st.meta["replay"]` will say which (NOTE [Replayed loss triggers])."""
    snap = getattr(tracer, "_snapshot", None)
    if snap is None:
        return False
    try:
        why = replay(ts, snap, api, args, kwargs)
    except Exception as exc:  # never let the replay break training: the backward is traced as before
        log.warning("gradscape: step %s could not be replayed: %s", ts.st.step, exc)
        why = f"the replay failed: {type(exc).__name__}: {exc}"
    if why is not None:
        ts.replayed = {"forward": "not replayed", "why": why}
    return why is None
