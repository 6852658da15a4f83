"""The time a traced step spends inside the problem finder (`bench/overhead.py --finder`): its two calls, at each
backward's start and at the step's end, wrapped while the finder is on."""

from __future__ import annotations

import time
from typing import Any

import gradscape.tracer.record.debug.problems as problem_finder


class FinderClock:
    """Time spent inside the problem finder's two calls (backward start, step end) while it is on."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.steps = 0
        cls = problem_finder.StepProblems
        self._orig = (cls.at_backward, cls.finish)
        clock = self

        def at_backward(this: Any, *a: Any) -> None:
            t0 = time.perf_counter()
            try:
                clock._orig[0](this, *a)
            finally:
                clock.seconds += time.perf_counter() - t0

        def finish(this: Any, *a: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return clock._orig[1](this, *a)
            finally:
                clock.seconds += time.perf_counter() - t0
                clock.steps += problem_finder.enabled

        cls.at_backward, cls.finish = at_backward, finish  # type: ignore[method-assign,assignment]

    def per_step_us(self) -> float:
        return 1e6 * self.seconds / max(self.steps, 1)

    def close(self) -> None:
        problem_finder.StepProblems.at_backward, problem_finder.StepProblems.finish = self._orig  # type: ignore
