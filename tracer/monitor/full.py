"""The context of a full monitored step (NOTE [Light steps] in light.py says which steps are full): the step's
capture, and its trace when it has one; its times to the sampler (NOTE [Sampled norms] in sampling.py)."""

from __future__ import annotations

import time
from typing import Any

from gradscape.tracer.monitor.capture import StepCapture


class MonitoredStep:
    """The context of every step while the monitor is on: the capture, and the trace when there is one."""

    light = False  # (NOTE [Light steps] in light.py)

    def __init__(self, monitor: Any, i: int, traced: Any, owner: Any, norms: bool) -> None:
        self.mon = monitor
        self.norms = norms
        self.owner = owner  # the Tracer, held while the block is open (the monitor holds a proxy of it)
        self.i = i
        self.traced = traced
        self.cap: StepCapture | None = None
        self.t0 = 0.0
        self.entered = 0.0  # seconds the block's opening took
        self.snap: Any = None  # the forward's snapshot (tracer/record/replay.py), if the Tracer keeps one
        self.snap_spent = 0.0  # its `spent` as the block opened

    def __enter__(self) -> Any:
        t0 = time.perf_counter()
        cap = self.cap = StepCapture(self.mon, self.i, self.traced, self.norms)
        cap.installed.install()
        snap = self.snap = getattr(self.owner, "_snapshot", None)
        self.snap_spent = snap.spent if snap is not None else 0.0
        self.t0 = time.perf_counter()
        self.entered = self.t0 - t0
        if self.traced is None:
            return None
        try:
            return self.traced.__enter__()
        except BaseException:
            cap.finish()
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        cap = self.cap
        assert cap is not None
        t1 = time.perf_counter()
        untraced = cap.traced is None
        norms = cap.clock.spent if cap.norms else None
        try:
            cap.finish()
            self.mon.end_step(cap, (exc_type, exc, tb))
        finally:
            cap.installed.remove()
            cap.release()  # no reference cycle left to the cyclic collector
            if untraced:  # what the monitor cost against the loop's time (NOTE [Sampled norms])
                self._took(norms, cap.own.spent, t1)
            self.cap = self.traced = self.owner = self.snap = None
        return None

    def _took(self, norms: float | None, inside: float, t1: float) -> None:
        """The block's times to the sampler: its norms, the whole block, and the monitor's own part of it (its calls
        inside the block, the norms aside; the forward's snapshot; opening and closing the block)."""
        snap = self.snap
        kept = (snap.spent - self.snap_spent) if snap is not None else 0.0
        t2 = time.perf_counter()
        own = inside - (norms or 0.0) + kept + self.entered + (t2 - t1)
        self.mon.sampler.took(norms, t2 - self.t0 + self.entered, own)
