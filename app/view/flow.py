"""Gradient flow: how big the parameter gradients are, layer by layer, in one step and over steps.

The classic check for vanishing or exploding gradients ("plot_grad_flow"): one bar pair per layer
with parameters, in forward order, input side on the left. The tracer keeps statistics, not every
value, so the exact mean |g| is unknown; the chart shows the RMS, ‖g‖₂/√numel, instead (the
quadratic mean of |g|, never below the mean |g|), next to max |g| = max(|min|, |max|).
"""

from __future__ import annotations

import math
from typing import Any

from gradscape.app.view.step_fields import ROOT_MODULE, Wire, max_abs, nonfinite, numel, stat, step_index, tensor

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
    accumulated = step_index(wire).accumulated
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


# the flow chart's rows: one per layer, tall enough that no two layer names touch (labels are 11 px)
ROW_PX, FLOW_MARGIN_PX, MIN_FLOW_PX = 20, 178, 320


def short_names(names: list[str]) -> list[str]:
    """The layer names without the dotted prefix they all share (`transformer.h.0.attn.c_attn` →
    `h.0.attn.c_attn` in a GPT-2): the chart's labels; the full name is in each bar's hover text."""
    if len(names) < 2:
        return list(names)
    parts = [n.split(".") for n in names]
    common = 0
    while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
        common += 1
    return [".".join(p[common:]) for p in parts]


def gradient_flow(wire: Wire) -> dict[str, Any]:
    """A plotly bar figure dict: max |g| and RMS |g| per layer for this step, one row per layer (bars laid
    out horizontally, input side at the top), so every layer's name is written out in full width however
    many layers there are; the figure's height grows with the rows."""
    rows = flow_rows(wire)
    y = short_names([r["layer"] for r in rows])
    hover = [f"{r['layer']} ({r['type']}): {', '.join(r['params'])}<br>numel {r['numel']}, ‖g‖₂ {r['norm']:.3g}"
             + (f"<br>NaN {r['nan']}, Inf {r['inf']}" if r["nan"] or r["inf"] else "")
             + ("<br>all-zero gradient" if not r["norm"] else "") for r in rows]
    bad = ["#d62728" if r["nan"] or r["inf"] else None for r in rows]
    maxes = [_positive(r["max"]) for r in rows]
    rmses = [_positive(r["rms"]) for r in rows]
    data = [
        {"type": "bar", "orientation": "h", "name": "max |g| = max(|min|, |max|)", "y": y, "x": maxes,
         "hovertext": hover, "hoverinfo": "text+x", "marker": {"color": [c or "#9ecae1" for c in bad]},
         "opacity": 0.8},
        {"type": "bar", "orientation": "h", "name": "RMS |g| = ‖g‖₂/√numel", "y": y, "x": rmses,
         "hovertext": hover, "hoverinfo": "text+x", "marker": {"color": [c or "#08519c" for c in bad]}},
    ]
    layout = {"title": {"text": f"Gradient flow, step {wire.get('step')}"
                        "<br><sup>forward order, input at the top; RMS shown: the mean |g| is not recorded</sup>",
                        "font": {"size": 14}, "yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 6}},
              "barmode": "overlay", "height": flow_height(len(rows)),
              "yaxis": {"title": {"text": "layer"}, "type": "category", "autorange": "reversed",
                        "automargin": True, "tickfont": {"size": 11}, "dtick": 1},
              "xaxis": {**_log_axis(Y_TITLE, maxes + rmses), "side": "top"},
              "legend": {"orientation": "h", "y": 0, "yanchor": "top", "x": 0},
              # room above the plot for the title and subtitle (at the top) and the top axis's title under them
              "margin": {"l": 60, "r": 10, "t": 124, "b": 40}}
    return {"data": data, "layout": layout}


def flow_height(layers: int) -> int:
    """The flow chart's height in px for `layers` rows (the page sizes the chart's box to it)."""
    return max(MIN_FLOW_PX, FLOW_MARGIN_PX + ROW_PX * layers)


def norm_over_steps(steps: list[Wire]) -> dict[str, Any]:
    """A plotly line figure dict: each layer's gradient norm ‖g‖₂ (all its parameters) per training
    step, from several steps' wire graphs. Layers follow the forward order of the latest step."""
    return norm_over_rows([(w.get("step"), flow_rows(w)) for w in steps])


def norm_over_rows(steps: list[tuple[int | None, list[dict[str, Any]]]]) -> dict[str, Any]:
    """`norm_over_steps` from each step's `flow_rows`, given as (step, rows): what the page keeps per step,
    so a new step of a streaming run adds one step's rows instead of decoding every step again."""
    ordered = sorted(steps, key=lambda s: s[0] or 0)
    per_step = [{r["layer"]: r for r in rows} for _, rows in ordered]
    layers = [r["layer"] for r in ordered[-1][1]] if ordered else []
    for table in per_step:  # layers missing from the latest step still get a line
        layers += [name for name in table if name not in layers]
    xs = [step for step, _ in ordered]
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
