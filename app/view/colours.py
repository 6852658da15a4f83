"""Node colours: the statistic a node is coloured by (of the gradient that arrived at it), the sequential
scale it goes through, the legend, and label colours that read on any fill (WCAG 2 contrast)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gradscape.app.view.step_fields import Wire, fmt_num, max_abs, stat, step_index, tensor, zero_fraction
from gradscape.tracer.wire import WireNode, WireTensor
from gradscape.tracer.wire.step_index import COLOURINGS

COLOR_BY = COLOURINGS  # the colourings the step index keeps a value of, per node
# Viridis (plotly.colors.sequential.Viridis): perceptually uniform, readable when printed grey.
SCALE = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b",
         "#fde725")
MISSING_COLOR = "#d0d0d0"  # no gradient recorded (the node did not run, or the slot was None)
NAN_FILL = "#ff3333"  # a node with a NaN or Inf in its gradients (with a red border)
PAGE_BACKGROUND = "#ffffff"  # behind the graph: where a module box's label sits (above the box)
BOX_FILL = "#2b5d9c"  # a module box, drawn at 6 % opacity
DARK_TEXT, LIGHT_TEXT = "#000000", "#ffffff"
_TITLES = {
    "norm": "‖∂L/∂output‖₂ (log₁₀)",
    "maxabs": "max |∂L/∂output| (log₁₀)",
    "zeros": "fraction of ∂L/∂output that is exactly 0",
}


def check_color_by(color_by: str) -> None:
    if color_by not in COLOR_BY:
        raise ValueError(f"color_by must be one of {COLOR_BY}, got {color_by!r}")


def statistic(t: WireTensor | None, color_by: str) -> float | None:
    """The raw statistic a node is coloured by (None when there is no tensor)."""
    if t is None:
        return None
    if color_by == "norm":
        return stat(t, "norm")
    if color_by == "maxabs":
        return max_abs(t)
    return zero_fraction(t)


def _scaled(value: float | None, color_by: str) -> float | None:
    """Magnitudes span many decades, so they are coloured by log₁₀; 0 has no logarithm and is
    clamped to the bottom of the scale by the caller (`-inf`)."""
    if value is None or math.isnan(value):
        return None
    if color_by == "zeros":
        return value
    return math.log10(value) if value > 0 else -math.inf


def colour_range(wire: Wire, color_by: str) -> tuple[float, float]:
    return range_of(step_index(wire).values[color_by], color_by)


def range_of(values: list[float | None], color_by: str) -> tuple[float, float]:
    """The colour range over the nodes' statistics `values` (what `statistic` gave for each): the log₁₀ of the
    smallest and largest positive finite value (log₁₀ is increasing: the same as the extremes of the scaled
    values, found without a Python call per node)."""
    if color_by == "zeros":
        return 0.0, 1.0
    arr = np.array(values, dtype=float)  # None (no gradient) becomes NaN, which no comparison keeps
    kept = arr[(arr > 0) & (arr < math.inf)]
    if not kept.size:
        return 0.0, 1.0
    lo, hi = math.log10(float(kept.min())), math.log10(float(kept.max()))
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    return lo, hi


def color_of(fraction: float | None, scale: tuple[str, ...] = SCALE) -> str:
    """A colour of the sequential `scale` for a position in [0, 1] (None: the 'missing' grey)."""
    if fraction is None:
        return MISSING_COLOR
    f = min(max(fraction, 0.0), 1.0) * (len(scale) - 1)
    i = min(int(f), len(scale) - 2)
    t = f - i
    a, b = scale[i], scale[i + 1]
    rgb = [round(int(a[k:k + 2], 16) * (1 - t) + int(b[k:k + 2], 16) * t) for k in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def luminance(color: str) -> float:
    """WCAG 2 relative luminance of a `#rrggbb` colour."""
    out = 0.0
    for weight, k in ((0.2126, 1), (0.7152, 3), (0.0722, 5)):
        c = int(color[k:k + 2], 16) / 255
        out += weight * (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4)
    return out


def contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two `#rrggbb` colours (1 to 21; AA asks 4.5 for text)."""
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def text_color(fill: str) -> str:
    """Black or white, whichever contrasts more with `fill`: at least 4.58:1 for any fill (the worst
    fill is the one equally far from both, luminance 0.179), so every label passes WCAG AA."""
    return DARK_TEXT if contrast(fill, DARK_TEXT) >= contrast(fill, LIGHT_TEXT) else LIGHT_TEXT


def _tick_label(v: float, color_by: str) -> str:
    if color_by == "zeros":
        return f"{v:.0%}"
    return f"1e{int(v)}" if v == int(v) else f"{10 ** v:.2g}"


def legend(wire: Wire, color_by: str = "norm", span: tuple[float, float] | None = None) -> dict[str, Any]:
    """Range, ticks and gradient of the node colours, for a legend drawn next to the graph.

    The range covers every node of the step (not only the drawn ones), so colours do not change
    meaning when a module is expanded; `span` is that range when the caller has it already.
    """
    check_color_by(color_by)
    lo, hi = span or colour_range(wire, color_by)
    if color_by == "zeros":
        values = [0.0, 0.25, 0.5, 0.75, 1.0]
    else:
        values = [float(d) for d in range(math.ceil(lo), math.floor(hi) + 1)]
        if len(values) < 2:
            values = [lo, hi]
    ticks = [{"value": v, "label": _tick_label(v, color_by), "at": (v - lo) / (hi - lo),
              "color": color_of((v - lo) / (hi - lo))} for v in values]
    stops = [[k / (len(SCALE) - 1), c] for k, c in enumerate(SCALE)]
    return {"color_by": color_by, "title": _TITLES[color_by], "log": color_by != "zeros", "min": lo, "max": hi,
            "min_label": _tick_label(lo, color_by) if color_by == "zeros" else f"{10 ** lo:.2g}",
            "max_label": _tick_label(hi, color_by) if color_by == "zeros" else f"{10 ** hi:.2g}",
            "ticks": ticks, "colorscale": stops, "missing": MISSING_COLOR,
            "css_gradient": "linear-gradient(to right, " + ", ".join(SCALE) + ")"}


def arrived(wire: Wire, node: WireNode) -> WireTensor | None:
    """grad_outputs[0] of a node: the gradient that arrived from the loss side."""
    go = node["go"] or []
    return tensor(wire, go[0]) if go else None


def colour_fields(value: float | None, color_by: str, lo: float, hi: float) -> dict[str, Any]:
    s = _scaled(value, color_by)
    frac = None if s is None else (0.0 if s == -math.inf else (s - lo) / (hi - lo))
    return {"value": value, "color": color_of(frac), "value_text": "no gradient" if value is None else
            (f"{value:.1%}" if color_by == "zeros" else fmt_num(value))}
