"""Gradient flow: how big the parameter gradients are, layer by layer, in one step and over steps.

The classic check for vanishing or exploding gradients ("plot_grad_flow"): one bar pair per layer
with parameters, in forward order, input side on the left. The tracer keeps statistics, not every
value, so the exact mean |g| is unknown; the chart shows the RMS, ‖g‖₂/√numel, instead (the
quadratic mean of |g|, never below the mean |g|), next to max |g| = max(|min|, |max|).
"""

from __future__ import annotations

import math
from typing import Any

from gradscape.app.view._wire import ROOT_MODULE, Wire, max_abs, nonfinite, numel, stat, tensor

Y_TITLE = "|grad| (log scale)"
# A log axis reads well with ticks at powers of ten only, written 1e-3, 1e+0, …: plotly's own minor
# ticks on a log axis ("2, 3, 0.1, 2, 3") name no decade and read as a different scale.
LOG_AXIS = {"type": "log", "dtick": 1, "tickformat": ".0e", "automargin": True}


def _forward_order(wire: Wire) -> list[str]:
    """Modules with parameters of their own, in the order their parameters were used in forward.

    Backward runs in reverse and a parameter's AccumulateGrad runs once every use has sent its
    gradient, so the layer whose parameters were accumulated LAST was used FIRST. This also places
    weights used without a module call (`out_proj` inside `nn.MultiheadAttention`) and tied
    weights (an embedding reused as the output projection counts at its first use). A layer whose
    parameters got no gradient falls back to its last op, then to registration order.
    """
    modules = wire["modules"]
    nodes = wire["nodes"]
    accumulated: dict[str, int] = {}
    for n in nodes:
        if (p := n["param"]) and (order := n["order"]) is not None:
            accumulated[p] = order
    keyed = []
    for rank, (name, mod) in enumerate(modules.items()):
        params = mod["params"]
        if not params:
            continue
        seen = [accumulated[p] for p in params if p in accumulated]
        when = max(seen) if seen else None
        if when is None:
            calls = mod["calls"]
            last = calls[0]["last"] if calls else None
            when = nodes[last]["order"] if last is not None else None
        keyed.append((when is None, -(when or 0), rank, name))
    return [name for *_, name in sorted(keyed)]


def flow_rows(wire: Wire) -> list[dict[str, Any]]:
    """Per layer: the RMS and max |g| over all its parameters' gradients, their total norm, and
    NaN/Inf counts (a layer with non-finite gradients is flagged, not dropped)."""
    modules = wire["modules"]
    params = wire["params"]
    rows = []
    for name in _forward_order(wire):
        sq = count = 0.0
        peak: float | None = None
        nan = inf = 0
        names = []
        for p in modules[name]["params"]:
            t = tensor(wire, params.get(p))
            if t is None:
                continue
            names.append(p)
            norm = stat(t, "norm") or 0.0
            sq += norm * norm
            count += numel(t["shape"])
            m = max_abs(t)
            if m is not None and not math.isnan(m):
                peak = m if peak is None else max(peak, m)
            a, b = nonfinite(t)
            nan, inf = nan + a, inf + b
        if not names:
            continue
        rows.append({"layer": "model" if name == ROOT_MODULE else name, "module": name,
                     "type": modules[name].get("type"), "params": names, "numel": int(count),
                     "norm": math.sqrt(sq), "rms": math.sqrt(sq / count) if count else None, "max": peak,
                     "nan": nan, "inf": inf})
    return rows


def _positive(v: float | None) -> float | None:
    """A log axis cannot show 0: a zero gradient gets no bar and says so in its hover text."""
    return v if v is not None and v > 0 and math.isfinite(v) else None


def decades(values: list[float | None]) -> list[int] | None:
    """A log axis range (in powers of ten) from the decade below the smallest value to the one above
    the largest, so at least two power-of-ten ticks show; None without a positive value."""
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    return [lo, hi if hi > lo else lo + 1]


def _log_axis(title: str, values: list[float | None]) -> dict[str, Any]:
    span = decades(values)
    return {**LOG_AXIS, "title": {"text": title, "standoff": 8}, **({"range": span} if span else {})}


def gradient_flow(wire: Wire) -> dict[str, Any]:
    """A plotly bar figure dict: max |g| and RMS |g| per layer for this step."""
    rows = flow_rows(wire)
    x = [r["layer"] for r in rows]
    hover = [f"{r['layer']} ({r['type']}): {', '.join(r['params'])}<br>numel {r['numel']}, ‖g‖₂ {r['norm']:.3g}"
             + (f"<br>NaN {r['nan']}, Inf {r['inf']}" if r["nan"] or r["inf"] else "")
             + ("<br>all-zero gradient" if not r["norm"] else "") for r in rows]
    bad = ["#d62728" if r["nan"] or r["inf"] else None for r in rows]
    maxes = [_positive(r["max"]) for r in rows]
    rmses = [_positive(r["rms"]) for r in rows]
    data = [
        {"type": "bar", "name": "max |g| = max(|min|, |max|)", "x": x, "y": maxes,
         "hovertext": hover, "marker": {"color": [c or "#9ecae1" for c in bad]}, "opacity": 0.8},
        {"type": "bar", "name": "RMS |g| = ‖g‖₂/√numel", "x": x, "y": rmses,
         "hovertext": hover, "marker": {"color": [c or "#08519c" for c in bad]}},
    ]
    layout = {"title": {"text": f"Gradient flow, step {wire.get('step')}"
                        "<br><sup>forward order, input → output; RMS shown: the mean |g| is not recorded</sup>",
                        "font": {"size": 14}},
              "barmode": "overlay", "xaxis": {"title": {"text": "layer (module with parameters)"}, "type": "category",
                                              "automargin": True},
              "yaxis": _log_axis(Y_TITLE, maxes + rmses),
              "legend": {"orientation": "h", "y": -0.35, "yanchor": "top"},
              "margin": {"l": 60, "r": 10, "t": 56, "b": 80}}
    return {"data": data, "layout": layout}


def norm_over_steps(steps: list[Wire]) -> dict[str, Any]:
    """A plotly line figure dict: each layer's gradient norm ‖g‖₂ (all its parameters) per training
    step, from several steps' wire graphs. Layers follow the forward order of the latest step."""
    ordered = sorted(steps, key=lambda w: w.get("step", 0))
    per_step = [{r["layer"]: r for r in flow_rows(w)} for w in ordered]
    layers = [r["layer"] for r in flow_rows(ordered[-1])] if ordered else []
    for table in per_step:  # layers missing from the latest step still get a line
        layers += [name for name in table if name not in layers]
    xs = [w.get("step") for w in ordered]
    data = []
    every: list[float | None] = []
    for layer in layers:
        ys = [_positive(t[layer]["norm"]) if layer in t else None for t in per_step]
        every += ys
        data.append({"type": "scatter", "mode": "lines+markers", "name": layer, "x": xs, "y": ys,
                     "hovertemplate": f"{layer}<br>step %{{x}}: ‖g‖₂ %{{y:.3g}}<extra></extra>"})
    layout = {"title": {"text": "Gradient norm per layer over training steps", "font": {"size": 14}},
              "xaxis": {"title": {"text": "training step"}, "automargin": True},
              "yaxis": _log_axis("layer ‖g‖₂ (log scale)", every),
              "margin": {"l": 60, "r": 10, "t": 50, "b": 50}}
    return {"data": data, "layout": layout}
