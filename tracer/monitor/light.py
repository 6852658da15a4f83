"""A monitored step without norms: what is checked on every step, and nothing more (NOTE [Light steps]).

NOTE [Light steps]
    A step that takes no gradient norms (NOTE [Sampled norms] in `sampling.py`) and is not traced is a
    light step: its block sees only its backward calls, through the wrappers held between the Tracer's
    blocks (NOTE [Patched backward] in tracer/record/patched_calls.py), and GradScaler's unscale. It reads
    each loss (on the CPU at once; on another device kept, and read when its row is resolved, as a full
    step's are), and at its end keeps its row: the losses, the learning rates of the optimizers the monitor
    has seen stepping (read from their parameter groups as the block ends), `norms` false. The loss rules
    read the losses as the row joins the history (`Monitor.drain`: NOTE [Light rows] in light_rows.py), at
    the latest as the step ends, so a loss trigger set off on a light step traces the next step, as on a
    device; only a full step keeps the model's calls for a replay of its own backward
    (NOTE [Replayed loss triggers] in tracer/record/replay.py). What a light step does not do, and a full one
    does: the forward snapshot, the optimizer hooks (what each optimizer stepped with, and whether it did),
    the clipped norms. A GradScaler's unscale seen on a light step is read at its end (its `found_inf`: a wait
    on a device), and from then on every step of the Tracer is a full one, whose skip is read without a wait.
    Nor does it look at the backward wrappers while the monitor's hold keeps them in place (a full step's
    block does, and wraps again whatever replaced them). The monitor hands out the same context again once
    it closed (`Monitor.step`), holding the monitor only while it is open.

    Why: on the 3-20-30-2 MLP (bench W1, 0.26 ms a step) a full step without norms cost about 100 µs, most
    of it Python calls around the loop's own (the forward snapshot alone 22 µs); the every-step monitor may
    cost 3%. The full steps' whole cost, not only their norms', is what `NormSampler` spreads over k steps.
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer.record import patched_calls
from gradscape.tracer.record.roots import root_values

log = logging.getLogger(__name__)
_mode_on = _compat.modes_enabled


class LightStep:
    """The context of a light step (NOTE [Light steps]): the Tracer marked busy, this step the thread's capture
    for the wrapped backward calls, the row kept at its end (NOTE [Light rows] in light_rows.py). The monitor
    hands out the same one again once it has closed (`Monitor.step`)."""

    light = True  # (the Tracer returns it as it is: no `_Busy`, no `Replayable` around it)
    traced = None

    __slots__ = ("mon", "owner", "step", "losses", "on_device", "found_inf", "spent", "t0", "timed")

    def __init__(self) -> None:
        self.mon: Any = None  # the monitor, while the block is open (no cycle with it between blocks)
        self.owner: Any = None  # the Tracer, held while the block is open (the monitor holds a proxy of it)
        self.step = 0
        self.losses: list[Any] = []  # floats, or a device's 0-d tensors (detached), or None (not a scalar)
        self.on_device = False
        self.found_inf: list[torch.Tensor] = []  # GradScaler's, when one unscaled in the block
        self.spent = 0.0  # seconds in the monitor's own calls inside the block
        self.t0 = 0.0
        self.timed = False  # the sampler is told what this step cost (NOTE [Sampled norms])

    def open(self, monitor: Any, i: int, owner: Any, timed: bool) -> LightStep:
        """Ready for step `i` (this object is handed out again only after its block closed)."""
        self.mon = monitor
        self.owner = owner
        self.step = i
        self.losses = []
        self.timed = timed
        if self.on_device or self.found_inf:
            self.on_device = False
            self.found_inf = []
        return self

    def __enter__(self) -> None:
        t0 = perf_counter()
        self.owner._active = True  # (`Tracer.step` refused a nested block already)
        patched_calls.install(self, checked=False)
        self.t0 = t0
        self.spent = perf_counter() - t0
        return None

    def __exit__(self, *exc: Any) -> None:
        t1 = perf_counter()
        patched_calls.uninstall(self)
        self.owner._active = False
        self.owner = None
        mon = self.mon
        self.mon = None
        joined = False
        try:
            joined = mon.take_light(self)
        except Exception as err:  # the monitor never breaks the loop
            log.warning("gradscape: the monitor could not record step %s: %s", self.step, err)
        if self.timed:  # (a batch of rows is counted a row a step: NOTE [Light rows] in light_rows.py)
            t2 = perf_counter()
            light = mon.light
            own = self.spent + (t2 - t1) + light.per_row - (light.spent if joined else 0.0)
            mon.sampler.took(None, t2 - self.t0, own)
        mon.free = self
        return None  # never swallow the user's exception

    # ------------------------------------------------------------------ what the wrappers hand it
    def on_backward(self, api: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        t0 = perf_counter()
        t = args[0] if args and api == "Tensor.backward" else None
        if type(t) is torch.Tensor and t.is_cpu and t.requires_grad and not _mode_on() and t.numel() == 1:
            self.losses.append(t.item())  # (the usual: `loss.backward()` of a plain tensor, no torch-function mode)
            self.spent += perf_counter() - t0
            return func(*args, **kwargs)
        try:
            with _compat.DisableTorchFunction():  # our reads: not through a mode of the loop's
                self._read(root_values(api, args, kwargs))
        except Exception as err:  # the monitor never breaks a backward
            log.warning("gradscape: the monitor could not read a backward's roots: %s", err)
        self.spent += perf_counter() - t0
        return func(*args, **kwargs)

    def _read(self, roots: list[Any]) -> None:
        out = self.losses
        for t in roots:
            if t is None or t.numel() != 1:
                out.append(None)
            elif t.is_cpu:
                out.append(t.item())  # (`float(t)` warns for a tensor that requires grad)
            else:
                self.on_device = True
                out.append(t.detach())

    def on_unscale(self, args: tuple[Any, ...], opt: Any) -> None:
        """GradScaler unscaled: its `found_inf` kept, read at the block's end; the monitor's steps full from now."""
        self.mon.scaler_seen = True
        if len(args) > 1 and isinstance(args[1], torch.Tensor):
            self.found_inf.append(args[1])

    def before_change(self, clip: bool = False) -> None:
        return None

    def on_clip(self, api: str, params: list[Any]) -> None:
        return None  # (the clipped norms are a full step's)

    def skipped(self) -> bool:
        """GradScaler found inf/NaN in the block (it skipped its optimizer step)."""
        with _compat.DisableTorchFunction():
            return any(bool((f != 0).any()) for f in self.found_inf)
