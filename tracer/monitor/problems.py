"""The monitor's problems: which layer rose first and most before a spike, and which parameters held
inf/NaN when GradScaler skipped a step. Plain numbers in, `Problem` out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gradscape.tracer._model import Problem, StepTrace
from gradscape.tracer.summary.stats import median

RISE = 3.0  # a layer "has risen" once its gradient norm is this many times its own median
LOOKBACK = 5  # steps before the spike in which an earlier rise is looked for


def rising_layer(window: Sequence[tuple[int, list[float | None]]], now_step: int,
                 now: list[float | None]) -> dict[str, Any] | None:
    """The parameter whose gradient norm rose first and most against its own median over `window`
    (earlier steps' norms): {"index", "ratio", "first"} (ratio at `now_step`, the step its rise began)."""
    best: tuple[int, float, int] | None = None  # (first step, -ratio, index): smallest wins
    recent = list(window)[-LOOKBACK:]
    for j, x in enumerate(now):
        hist: list[float] = []
        for _, row in window:
            v = row[j] if j < len(row) else None
            if v is not None and math.isfinite(v):
                hist.append(float(v))
        if x is None or len(hist) < 3:
            continue
        med = median(hist)
        if med <= 0:
            continue
        ratio = x / med if math.isfinite(x) else math.inf
        first = now_step
        if ratio >= RISE:
            for s, row in recent:
                v = row[j] if j < len(row) else None
                if v is not None and (not math.isfinite(v) or v / med >= RISE):
                    first = s
                    break
        else:
            first = now_step + 1  # did not rise: only wins when nothing did
        key = (first, -ratio, j)
        if best is None or key < best:
            best = key
    if best is None:
        return None
    return {"index": best[2], "ratio": -best[1], "first": min(best[0], now_step)}


def _layer_words(st: StepTrace, name: str) -> tuple[str, int | None]:
    node = st.param_node(name)
    module = name.rsplit(".", 1)[0] if "." in name else "<root>"
    return f"{name} (module {module})", None if node is None else node.id


def spike_problem(st: StepTrace, kind: str, d: dict[str, Any], names: list[str]) -> Problem:
    """`loss_spike` / `grad_spike`: what spiked, at which step, and the layer that rose first and most."""
    what = "loss" if kind == "loss_spike" else "total gradient norm"
    value = d.get("loss" if kind == "loss_spike" else "grad_norm")
    text = f"The {what} spiked at step {d['step']}"
    if all(isinstance(d.get(k), (int, float)) for k in ("median", "threshold")) and isinstance(value, (int, float)):
        text += (f": {value:.4g} against a median of {d['median']:.4g} over recent steps "
                 f"(threshold {d['threshold']:.4g}).")
    else:
        text += "."
    if d["step"] != st.step:
        text += f" This trace is of step {st.step}, the step after it."
    layer = d.get("layer")
    param, node = None, None
    if layer is not None and layer["index"] < len(names):
        param = names[layer["index"]]
        words, node = _layer_words(st, param)
        text += f" The gradient of {words} rose first and most: {layer['ratio']:.3g}× its own median"
        text += f", from step {layer['first']}." if layer["first"] != d["step"] else "."
    return Problem(kind, text, node, param, None)


def amp_problem(st: StepTrace, d: dict[str, Any]) -> Problem:
    """`amp_skipped`: the step GradScaler skipped, its scale, and the parameters whose gradients held inf/NaN."""
    bad: list[str] = d.get("params", [])
    scale = d.get("scale")
    text = f"GradScaler skipped the optimizer step of step {d['step']}" + (
        f" at scale {scale:g}" if scale is not None else "") + ": "
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        text += f"the gradients of {shown} held inf/NaN."
    else:
        text += "its gradients held inf/NaN."
    if d["step"] != st.step:
        text += f" This trace is of step {st.step}, the step after it."
    node = st.param_node(bad[0]) if bad else None
    return Problem("amp_skipped", text, None if node is None else node.id, bad[0] if bad else None, None)
