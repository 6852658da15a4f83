"""What a step says of torch.compile, as the page shows it: its notes (`step_notes`, over the graph; the step
ran its compiled regions eagerly for tracing, was replayed, or was not, and why), and the comparison of the
compiled and the eager gradients (`Tracer.compare_compiled`) as table rows (`compare_rows`) and as a
colouring of the graph (`DIFF`: each parameter's node by its max |compiled − eager|, `diff_values`).

They read `wire["meta"]` only: `compiled` (NOTE [Compiled regions on a traced step] in
tracer/record/compiled.py), `replay` (NOTE [Replayed loss triggers] in tracer/record/replay.py) and
`compare_compiled` (NOTE [Compare compiled] in tracer/record/compare.py). Each is absent from a step it
does not apply to, and so is what is drawn of it.

NOTE [Difference colouring]
    The colouring `DIFF` is offered only for a step with `compare_compiled`. A parameter's node (the one
    that names it: its AccumulateGrad) is coloured by the parameter's max |compiled − eager| on a log₁₀
    scale from the smallest positive difference of the step to the largest (YlOrBr, without its two
    palest colours, which read as white, and with no pure red, a NaN's fill); a difference of exactly 0
    is white (`ZERO_DIFF`), an infinite one (a NaN on either side counts as infinite) and a parameter
    only one run gave a gradient to the top of the scale, and every other node, which has no difference
    of its own, the "missing" grey. The
    parameter with the largest difference (`worst`, when it is not 0) also has the class `worstdiff` (a
    thick dark blue border). A folded module shows the largest of its members.
"""

from __future__ import annotations

import math
from typing import Any

from gradscape.app.view.colours import MISSING_COLOR, color_of
from gradscape.app.view.step_fields import Wire, fmt_num, step_index

DIFF = "compiled"  # the colouring by compiled − eager difference (a `color_by` value)
DIFF_LABEL = "|compiled − eager|"
# YlOrBr (plotly.colors.sequential.YlOrBr) without its two palest colours: sequential, apart from white, and
# with no pure red in it (red is a NaN's fill)
DIFF_SCALE = ("#fee391", "#fec44f", "#fe9929", "#ec7014", "#cc4c02", "#993404", "#662506")
ZERO_DIFF = "#ffffff"  # a parameter whose compiled and eager gradients are equal
DIFF_TITLE = "max |compiled − eager| per parameter (log₁₀)"


def number(v: Any) -> float | None:
    """A number of the meta (NaN and infinities are written as text there: "nan", "inf"), or None."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def step_notes(wire: Wire) -> list[dict[str, str]]:
    """What the step says of torch.compile (over the graph; in the offline file's header): `kind` (`compiled`,
    `replay`, `replay-refused`, `compare`), a short `text` and a longer `title`; none for a step none of it
    applies to."""
    meta = wire["meta"]
    out: list[dict[str, str]] = []
    compiled = meta.get("compiled")
    if compiled == "eager":
        out.append({"kind": "compiled", "text": "ran eagerly for tracing (compiled model)",
                    "title": "this traced step ran the model's compiled regions eagerly, so the trace has every op; "
                             "its gradients are the eager ones (untraced steps run compiled)"})
    elif compiled == "opaque":
        out.append({"kind": "compiled", "text": "compiled regions kept whole",
                    "title": "each compiled region of this step is one node (CompiledFunctionBackward): "
                             "no op, module or gradient inside it"})
    replay = meta.get("replay")
    if isinstance(replay, dict):
        if replay.get("forward") == "replayed":
            calls = replay.get("calls")
            out.append({"kind": "replay", "text": "replayed eagerly",
                        "title": "a loss trigger: the model's forward and backward ran again, eagerly and traced, "
                                 "from the state before the forward" + (f" ({calls} call(s) of the model)"
                                                                        if calls is not None else "")})
        else:
            why = str(replay.get("why") or "no reason recorded")
            out.append({"kind": "replay-refused", "text": f"not replayed: {why}",
                        "title": "a loss trigger whose step could not be replayed: the trace is its backward alone"})
    cmp = meta.get("compare_compiled")
    if isinstance(cmp, dict):
        worst = worst_param(wire)
        text = "compiled vs eager: max |Δ| " + fmt_num(number(cmp.get("max_abs")))
        out.append({"kind": "compare", "text": text + (f" ({worst})" if worst else " (equal)"),
                    "title": "Tracer.compare_compiled: this step ran compiled and eager from the same state; the "
                             "table beside the graph has each parameter's difference"})
    return out


def has_comparison(wire: Wire) -> bool:
    return isinstance(wire["meta"].get("compare_compiled"), dict)


def _at(at: Any) -> str:
    return "[" + ", ".join(str(k) for k in at) + "]" if isinstance(at, list) else "—"


def compare_rows(wire: Wire) -> list[dict[str, Any]]:
    """The comparison's rows, worst first: a parameter one run gave no gradient to first (`missing`), then by
    max |compiled − eager| descending (ties in the model's order). Each row has the numbers (`max_abs`,
    `max_rel`, `compiled`, `eager`: floats, None when missing), `at` (the index) and `cells`, the texts shown."""
    cmp = wire["meta"].get("compare_compiled")
    if not isinstance(cmp, dict):
        return []
    rows = []
    for name, d in (cmp.get("params") or {}).items():
        if "missing" in d:
            side = d["missing"]
            rows.append({"param": name, "missing": side, "max_abs": None, "max_rel": None, "at": None,
                         "compiled": None, "eager": None,
                         "cells": [name, f"no {side} gradient", "—", "—", "—", "—"]})
            continue
        vals = {k: number(d.get(k)) for k in ("max_abs", "max_rel", "compiled", "eager")}
        rows.append({"param": name, "missing": None, **vals, "at": d.get("at"),
                     "cells": [name, fmt_num(vals["max_abs"]), fmt_num(vals["max_rel"]), _at(d.get("at")),
                               fmt_num(vals["compiled"]), fmt_num(vals["eager"])]})

    def key(r: dict[str, Any]) -> tuple[int, float]:
        m = r["max_abs"]
        return (0 if r["missing"] else 1, -(math.inf if m is None or math.isnan(m) else m))
    return sorted(rows, key=key)


COMPARE_COLUMNS = ("parameter", "max |Δ|", "max rel", "at", "compiled", "eager")


def diff_values(wire: Wire) -> list[float | None]:
    """Per node: its parameter's max |compiled − eager| (NOTE [Difference colouring]), None for the rest."""
    index = step_index(wire)
    values: list[float | None] = [None] * index.n_nodes
    cmp = wire["meta"].get("compare_compiled")
    params = cmp.get("params") if isinstance(cmp, dict) else None
    for name, d in (params or {}).items():
        node = index.param_node.get(name)
        if node is None or not 0 <= node < index.n_nodes:
            continue
        m = math.inf if "missing" in d else number(d.get("max_abs"))
        values[node] = math.inf if m is None or math.isnan(m) else m
    return values


def diff_range(values: list[float | None]) -> tuple[float, float]:
    """log₁₀ of the smallest and largest positive finite difference (a decade around a single one)."""
    kept = [v for v in values if v is not None and 0 < v < math.inf]
    if not kept:
        return -1.0, 0.0
    lo, hi = math.log10(min(kept)), math.log10(max(kept))
    return (lo - 0.5, hi + 0.5) if hi - lo < 1e-9 else (lo, hi)


def diff_fields(value: float | None, lo: float, hi: float) -> dict[str, Any]:
    """`color`, `value` and `value_text` of a node under the colouring `DIFF`."""
    if value is None:
        return {"value": None, "color": MISSING_COLOR, "value_text": "no parameter compared"}
    if value == 0:
        return {"value": 0.0, "color": ZERO_DIFF, "value_text": "0 (equal)"}
    frac = 1.0 if value == math.inf else (math.log10(value) - lo) / (hi - lo)
    return {"value": value, "color": color_of(frac, DIFF_SCALE), "value_text": fmt_num(value)}


def diff_legend(lo: float, hi: float) -> dict[str, Any]:
    """The colouring's key: its range and scale, and what white and grey stand for."""
    return {"color_by": DIFF, "title": DIFF_TITLE, "log": True, "min": lo, "max": hi,
            "min_label": f"{10 ** lo:.2g}", "max_label": f"{10 ** hi:.2g}", "missing": MISSING_COLOR,
            "zero": ZERO_DIFF,
            "css_gradient": "linear-gradient(to right, " + ", ".join(DIFF_SCALE) + ")",
            "key": [{"colour": ZERO_DIFF, "name": "0: equal"}, {"colour": MISSING_COLOR, "name": "no parameter"}]}


def worst_param(wire: Wire) -> str | None:
    """The parameter furthest from eager; None when there is no difference at all (every one is the worst)."""
    cmp = wire["meta"].get("compare_compiled")
    if not isinstance(cmp, dict) or not isinstance(cmp.get("worst"), str):
        return None
    m = number(cmp.get("max_abs"))
    return cmp["worst"] if m is None or m != 0 else None
