"""The run's timeline, from its history rows (`TraceStore.history`): plotly figures as plain dicts,
no Dash. Loss and total gradient norm over every step (log scale), GradScaler's scale where there is
one, traced steps marked and triggered ones in red with their reason; and a layers × steps heatmap of
each parameter's gradient norm against its own median, which shows which layer moved first."""

from __future__ import annotations

import math
from typing import Any

# steps drawn as SVG lines (WebGL's driver warns in a headless page); beyond it, untraced steps are
# thinned evenly (traced ones always stay)
MAX_POINTS = 5_000
TRIGGER_COLOUR = "#d62728"
TRACED_COLOUR = "#1f77b4"


def _pos(v: Any) -> float | None:
    """A value a log axis can show: positive and finite, else None (a gap)."""
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else None


def thin(rows: list[dict[str, Any]], limit: int = MAX_POINTS) -> list[dict[str, Any]]:
    if len(rows) <= limit:
        return rows
    stride = math.ceil(len(rows) / limit)
    return [r for k, r in enumerate(rows) if k % stride == 0 or r.get("traced")]


def timeline_figure(rows: list[dict[str, Any]], run: str | None) -> dict[str, Any]:
    rows = thin(rows)
    steps = [r["step"] for r in rows]
    traces: list[dict[str, Any]] = [
        {"type": "scatter", "mode": "lines", "name": "loss", "x": steps, "y": [_pos(r["loss"]) for r in rows],
         "line": {"color": "#444", "width": 1.5}, "hovertemplate": "step %{x}<br>loss %{y:.4g}<extra></extra>"},
        {"type": "scatter", "mode": "lines", "name": "‖grad‖", "x": steps, "yaxis": "y2",
         "y": [_pos(r["grad_norm"]) for r in rows], "line": {"color": "#ff7f0e", "width": 1.2},
         "hovertemplate": "step %{x}<br>‖grad‖ %{y:.4g}<extra></extra>"}]
    if any(r.get("scale") is not None for r in rows):
        traces.append({"type": "scatter", "mode": "lines", "name": "AMP scale", "x": steps, "yaxis": "y3",
                       "y": [_pos(r.get("scale")) for r in rows], "line": {"color": "#2ca02c", "dash": "dot"},
                       "hovertemplate": "step %{x}<br>scale %{y:g}<extra></extra>"})
    marks = [r for r in rows if r.get("traced") and _marker_y(r) is not None]
    if marks:
        traces.append({"type": "scatter", "mode": "markers", "name": "traced", "x": [r["step"] for r in marks],
                       "y": [_marker_y(r) for r in marks], "text": [r.get("trigger") or "" for r in marks],
                       "customdata": [_why(r) for r in marks], "cliponaxis": False,
                       "marker": {"size": [11 if r.get("trigger") else 8 for r in marks], "line": {"width": 1},
                                  "color": [TRIGGER_COLOUR if r.get("trigger") else TRACED_COLOUR for r in marks]},
                       "hovertemplate": "step %{x} (traced%{customdata[1]}): click to open<extra></extra>"})
    lost = [r for r in rows if r.get("traced") and _marker_y(r) is None]  # a NaN/Inf (or no) loss
    if lost:
        traces.append({"type": "scatter", "mode": "markers", "name": "NaN/Inf loss", "x": [r["step"] for r in lost],
                       "y": [1.0] * len(lost), "yaxis": "y4", "customdata": [_why(r) for r in lost],
                       "text": [r.get("trigger") or "" for r in lost], "cliponaxis": False,
                       "marker": {"size": 12, "symbol": "triangle-down", "color": TRIGGER_COLOUR,
                                  "line": {"width": 1, "color": "#000"}},
                       "hovertemplate": "step %{x}: the loss is NaN/Inf (traced%{customdata[1]}): click to open"
                                        "<extra></extra>"})
    skipped = [r for r in rows if r.get("skipped")]
    if skipped:
        traces.append({"type": "scatter", "mode": "markers", "name": "AMP skipped", "x": [r["step"] for r in skipped],
                       "y": [_marker_y(r) for r in skipped], "marker": {"symbol": "x", "color": "#9467bd"},
                       "hovertemplate": "step %{x}: GradScaler skipped it<extra></extra>"})
    labels = trigger_labels([r for r in rows if r.get("traced") and r.get("trigger")],
                            (max(steps) - min(steps)) if steps else 1)
    rows_used = 1 + max(((a["yshift"] - LABEL_LIFT) // LABEL_ROW for a in labels), default=-1)
    # log axes' ticks as plain numbers (plotly's default labels a short decade's minor ticks with single
    # digits beside full numbers: "4, 5, 8, 0.01225453, 2")
    ticks = {"tickformat": ".2~g", "nticks": 4}
    top = 6 + (LABEL_LIFT + LABEL_ROW * rows_used if labels else 0)
    layout = {"uirevision": run or "", "margin": {"l": 48, "r": 90, "t": top, "b": 24},
              "height": HEIGHT, "showlegend": True,
              "legend": {"orientation": "h", "y": -0.22, "x": 0, "yanchor": "top", "font": {"size": 11}},
              "xaxis": {"title": {"text": ""}, "domain": [0, 0.9]},
              "yaxis": {"type": "log", "title": {"text": "loss"}, **ticks},
              "yaxis2": {"type": "log", "overlaying": "y", "side": "right", "title": {"text": "‖grad‖"},
                         "showgrid": False, **ticks},
              "yaxis3": {"type": "log", "overlaying": "y", "side": "right", "position": 0.97, "anchor": "free",
                         "showgrid": False, "title": {"text": "scale"}, **ticks},
              # the top edge, where a step whose loss cannot be drawn (NaN/Inf) is marked
              "yaxis4": {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
              "annotations": labels, "clickmode": "event", "hovermode": "closest"}
    return {"data": traces, "layout": layout}


# px, the figure's height (assets/timeline.css holds the same). Plotly shrinks every margin when the plot
# between them would be under 64 px tall, the top one too, which then cuts off the labels' second row: with
# two rows of labels (a 40 px top margin) and the legend below (plotly grows the bottom margin to about 37 px,
# or 50 at a window narrow enough to wrap the legend) 160 px leaves the plot 70 px or more
HEIGHT = 160
LABEL_ROW = 14  # px: one row of trigger labels above the plot
LABEL_LIFT = 6  # px between the plot's top edge and the first row (a mark on the edge reaches into it)
LABEL_ROWS = 2  # rows of labels; a label with no room in them is left out (its mark's hover still names it)
PLOT_PX = 800  # the plot's width the labels are spaced for (less than the narrowest page gives it)


def trigger_labels(rows: list[dict[str, Any]], span: float) -> list[dict[str, Any]]:
    """A label above the plot for each triggered step (its trigger's name), in rows so no two overlap;
    `span`: the steps the x axis shows."""
    span = max(1.0, float(span)) * 1.1
    ends: list[float] = [-math.inf] * LABEL_ROWS  # where each row's last label ends, in steps
    out = []
    for r in rows:
        half = (7 * len(str(r["trigger"])) + 10) / 2 / PLOT_PX * span
        row = next((k for k in range(LABEL_ROWS) if r["step"] - half > ends[k]), None)
        if row is None:
            continue
        ends[row] = r["step"] + half
        out.append({"x": r["step"], "xref": "x", "y": 1, "yref": "paper", "yanchor": "bottom",
                    "yshift": LABEL_LIFT + LABEL_ROW * row, "text": str(r["trigger"]), "showarrow": False,
                    "font": {"color": TRIGGER_COLOUR, "size": 11}})
    return out


def _why(r: dict[str, Any]) -> list[Any]:
    return [r["step"], f": {r['trigger']}" if r.get("trigger") else ""]


def _marker_y(r: dict[str, Any]) -> float | None:
    """Where a traced step's mark sits: on the loss line, or on the top edge when the loss cannot be drawn."""
    y = _pos(r.get("loss"))
    return y


def heatmap_figure(rows: list[dict[str, Any]], run: str | None, max_layers: int = 60) -> dict[str, Any]:
    """log10(norm / the parameter's own median over the run shown), layers × steps."""
    rows = thin(rows, 4000)
    names: list[str] = []
    for r in rows:
        for n in r.get("param_norms", {}):
            if n not in names:
                names.append(n)
    names = names[:max_layers]
    z: list[list[float | None]] = []
    for n in names:
        vals = [r.get("param_norms", {}).get(n) for r in rows]
        finite = sorted(v for v in vals if isinstance(v, (int, float)) and math.isfinite(v) and v > 0)
        med = finite[len(finite) // 2] if finite else None
        z.append([_ratio(v, med) for v in vals])
    data = [{"type": "heatmap", "x": [r["step"] for r in rows], "y": names, "z": z, "zmid": 0, "zmin": -2, "zmax": 2,
             "colorscale": "RdBu", "reversescale": True,
             "colorbar": {"title": {"text": "log10 ×median"}, "thickness": 10},
             "hovertemplate": "%{y}<br>step %{x}<br>log10(norm / its median) %{z:.2f}<extra></extra>"}]
    layout = {"uirevision": run or "", "margin": {"l": 140, "r": 20, "t": 4, "b": 28},
              "height": min(60 + 14 * len(names), 320), "yaxis": {"autorange": "reversed", "tickfont": {"size": 9}}}
    return {"data": data, "layout": layout}


def _ratio(v: Any, med: float | None) -> float | None:
    if not isinstance(v, (int, float)) or med is None:
        return None
    if not math.isfinite(v):
        return 2.0  # inf/NaN: shown as the top of the scale
    return math.log10(v / med) if v > 0 else -2.0
