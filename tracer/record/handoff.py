"""A traced step's backward calls handed to its recorder when no monitor sees them (`Tracer(monitor=False)`).

NOTE [Backward handoff]
    A step whose forward is carried (NOTE [Carried forwards] in carry.py) runs without the function mode, so
    its backward calls reach the recorder only through the wrapped backward functions (NOTE [Patched
    backward] in patched_calls.py). The monitor's capture hands them over; a Tracer without the monitor
    installs this one instead, for its traced steps, so that its forwards are carried too. Before it, such a
    Tracer ran every traced forward under the mode and the module hooks: a traced GAN step of bench/loops.py
    cost +1.59 ms where the same Tracer with the monitor cost +1.12 ms. It hands a carried step's backward
    calls to the recorder and lets every other call through to the function behind the wrapper (a step
    recorded with the mode records it there, as a monitored one does); clips and GradScaler's unscale pass
    unseen, as they did (what the monitor reads of them is the monitor's).
"""

from __future__ import annotations

from typing import Any


class Handoff:
    """The capture of a traced step of a Tracer without the monitor (`patched_calls.install`)."""

    __slots__ = ("rec",)

    def __init__(self, rec: Any) -> None:
        self.rec = rec  # the step's `StepRecorder`

    def on_backward(self, api: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        rec = self.rec
        if rec.forward.carried:
            return rec._on_backward(api, func, args, kwargs)
        return func(*args, **kwargs)

    def before_change(self, clip: bool = False) -> None:
        return None

    def on_unscale(self, args: tuple[Any, ...], opt: Any) -> None:
        return None

    def on_clip(self, api: str, params: list[Any]) -> None:
        return None
