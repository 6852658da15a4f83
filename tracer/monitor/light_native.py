"""The light step in C++, where the native recorder is built (NOTE [Native light steps]).

NOTE [Native light steps]
    A light step (NOTE [Light steps] in light.py) does the same few things every step: it opens, reads each
    loss of `loss.backward()`, closes, and keeps its row (NOTE [Light rows] in light_rows.py). In Python that
    cost the 3-20-30-2 MLP's 0.17 ms step (bench W1) 31-33 µs, 1.18x, measured in the loop with parts switched
    off in turn: the capture put in place and taken off, the wrapper's dispatch to it and the block's clock
    11 µs, reading the loss 5-7 µs, keeping the row 10 µs. So where the extension is built (NOTE [Native
    recorder] in tracer/record/native.py) the block is the extension's `LightBlock` (tracer/record/csrc/light.h):
    - `open` and entering it mark the Tracer busy and put the block's Python side (`NativeLight`, a
      `LightStep`) on this thread's captures, as `patched_calls.install` would;
    - `Tensor.backward` is the extension's front (`backward_front`, made by tracer/record/patched_calls.py
      in front of its Python wrapper): inside an open block, on its thread, with no other capture above it
      and no call being handled, a loss that is a plain CPU tensor of one floating element that requires grad,
      with no torch-function mode, is read in C++ (float32 and float64 from memory, the others by `item`) and
      the call handed to the original as a handled one (its nested calls pass, as the Python wrapper's do);
    - on closing, the row is kept in C++ (the step, its losses, the learning rates of the parameter groups
      `LightRows.refresh` found, read as floats) with the quiet bounds of NOTE [Quiet bound], and `drain`
      called when the batch should join (the same rule as `LightRows.add`), which takes the rows
      (`LightRows.take`) and the timed steps' costs for the sampler (NOTE [Sampled norms] in sampling.py). The
      block hands its rows over compact (NOTE [Kept rows] in kept_rows.py: the steps' and loss counts' bytes,
      the losses, a row's rates asked of `LightRows.rates` once for each run of equal ones) with the same loss
      objects by their place for the rules' windows.
    Anything else goes to the Python side as it would to a Python light step: a loss through a mode, on a
    device, not a scalar, `torch.autograd.backward` or `grad`, GradScaler's unscale, a learning rate that is
    not a float. The first such call takes the losses read so far (`go_slow`), and the step ends as a Python
    light step does (`exit_slow`: `Monitor.take_light`). The monitor opens the native block only when a
    Python light step would keep its row on the CPU at once: no row waiting before it, no optimizer seen
    since the last refresh, the wrappers in place (`patched_calls.placed`). So the rows, their order and what
    the loss rules read are those of a Python light step; tests/test_light_steps.py and tests/test_light_rows.py
    run on both, and tests/test_native_light.py compares the two histories of one loop.

    The fast path. Deciding a step (`Tracer.step`, `Monitor.step`, the sampler's `due`) cost W1 about 6 µs in
    the loop, the same answer step after step. So when the monitor opens the block it also allows the next
    `NormSampler.light_run()` steps (those `due` would make light, up to the next full step), and `Tracer.step`
    asks the block first (`fast_open`): a step allowed, not scheduled by `every` (as it was when allowed), with
    the block closed and the Tracer in no other block, is opened there, and the sampler is told of the steps so
    taken when the monitor next decides one (`Monitor.sync_fast`). What would change the answer takes the
    allowance back at once: a trigger set off (the next step is traced), a row kept in Python (`exit_slow`), a
    call handed to the Python side (`go_slow`: GradScaler is one), the Tracer closed.
    Measured (bench/light_floor.py, one run each): the block took W1 to 1.109x and the fast path to 1.087x
    (the regression program, W6: 1.145x, 1.124x; 7 rounds of 1,000 steps); in one run of 9 rounds of 1,500
    steps, the light steps in Python against the native ones: W1 1.158x, 1.068x; W6 1.246x, 1.110x.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from gradscape.tracer.monitor.light import LightStep
from gradscape.tracer.monitor.light_rows import BATCH
from gradscape.tracer.monitor.sampling import TIMED
from gradscape.tracer.record import native, patched_calls

log = logging.getLogger(__name__)

ENABLED = True  # tests turn it off to run the Python light step where the extension is built


class NativeLight(LightStep):
    """The Python side of the extension's `LightBlock`: what the block hands it (NOTE [Native light steps]).
    The monitor holds the block, the block this, and this the monitor by a proxy: no cycle."""

    __slots__ = ("pulled",)

    def __init__(self, monitor: Any) -> None:
        super().__init__()
        self.mon = weakref.proxy(monitor)
        self.pulled = False  # this step is read here (`_pull`) from the first call the block handed on

    def _pull(self) -> None:
        if not self.pulled:
            block = self.mon.light.native
            self.pulled = True
            self.step = block.step
            self.losses = block.go_slow()
            self.on_device = False
            self.found_inf = []

    def on_backward(self, api: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._pull()
        return super().on_backward(api, func, args, kwargs)

    def on_unscale(self, args: tuple[Any, ...], opt: Any) -> None:
        self._pull()
        super().on_unscale(args, opt)

    # ------------------------------------------------------------------ what the block calls as it closes
    def exit_slow(self) -> None:
        """The step's row as a Python light step keeps it (its losses, those the block read first)."""
        self._pull()
        self.pulled = False
        try:
            self.mon.take_light(self)
        except Exception as err:  # the monitor never breaks the loop
            log.warning("gradscape: the monitor could not record step %s: %s", self.step, err)

    def drain(self) -> None:
        try:
            self.mon.drain()
        except Exception as err:
            log.warning("gradscape: the monitor could not keep the light steps' rows: %s", err)


def native_light(monitor: Any, flush_seconds: float) -> Any:
    """The monitor's native light step, the extension's `LightBlock`, or None where the extension is not built
    (or `ENABLED` is off)."""
    ext = native.extension() if ENABLED else None
    if ext is None or not hasattr(ext, "LightBlock"):
        return None
    side = NativeLight(monitor)
    return ext.LightBlock(side, patched_calls._captures, patched_calls._handling, BATCH, flush_seconds, TIMED)
