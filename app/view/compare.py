"""The compare view: one gradient on two sides (two ranks of a step, or two steps of a rank) as a
difference heatmap with its statistics.

What is compared (`target`): `"param:<name>"` is the gradient the optimizer sees for that parameter
(`params` of the step: after DDP's all-reduce, the same on every rank); `"node:<id>"` is what arrived at
that node (its first `grad_outputs` slot; its first sent slot when nothing arrived).

Full values are compared when both sides kept them (`tensors="full"`); otherwise the thumbnails
(block means, NOTE [Thumbnail views] in `tracer.summary.thumbnails`), and the view says so: equal thumbnails do
not prove equal tensors.

Desync: across ranks, after all-reduce, every rank's parameter gradient must be equal bit for bit; a
nonzero difference there means a rank skipped or diverged from the all-reduce (`desync` is then True).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from gradscape.app.view.grid import view_2d
from gradscape.app.view.heatmaps import heatmap_figure
from gradscape.app.view.step_fields import Wire, fmt_num, fmt_shape, stat, tensor
from gradscape.tracer.wire import TensorArrays, decode_array


def targets(wire: Wire) -> list[dict[str, str]]:
    """Dropdown options: every parameter of the step."""
    return [{"label": f"parameter {name}", "value": f"param:{name}"} for name in sorted(wire["params"])]


def node_target(wire: Wire, node: int) -> dict[str, str]:
    n = wire["nodes"][node]
    if (p := n["param"]) and p in wire["params"]:
        return {"label": f"parameter {p}", "value": f"param:{p}"}
    return {"label": f"node {node}: {n['name']}", "value": f"node:{node}"}


def target_tensor(wire: Wire, target: str | None) -> int | None:
    """The tensor index that `target` names in this step, or None when the step has none."""
    if not target:
        return None
    kind, _, name = target.partition(":")
    if kind == "param":
        ix = wire["params"].get(name)
        return None if ix is None else int(ix)
    if kind == "node" and name.isdigit():
        nid = int(name)
        nodes = wire["nodes"]
        if not 0 <= nid < len(nodes):
            return None
        for slot in (nodes[nid]["go"] or []) + (nodes[nid]["gi"] or []):
            if slot is not None:
                return int(slot)
    return None


def target_label(wire: Wire, target: str) -> str:
    kind, _, name = target.partition(":")
    if kind == "param":
        return f"parameter {name} (gradient the optimizer sees)"
    nodes = wire["nodes"]
    if name.isdigit() and int(name) < len(nodes):
        return f"node {name} {nodes[int(name)]['name']} (what arrived)"
    return target


def _array(entry: TensorArrays | None, key: Literal["thumb", "values"]) -> np.ndarray | None:
    a = entry[key] if entry else None
    return None if a is None else np.asarray(decode_array(a, key), dtype=np.float64)


def compare(wire_a: Wire, arrays_a: Mapping[int, TensorArrays], wire_b: Wire, arrays_b: Mapping[int, TensorArrays],
            target: str, *, label_a: str, label_b: str, across_ranks: bool) -> dict[str, Any]:
    """The difference A − B of `target` on two steps. Returns `{"title", "basis", "note", "figure",
    "stats" (rows of {"stat", "text"}), "max_abs", "desync", "error"}`; `error` (a sentence) when
    there is nothing to compare, and then no figure."""
    out: dict[str, Any] = {"title": f"{target_label(wire_a, target)}: {label_a} − {label_b}", "basis": None,
                           "note": None, "figure": None, "stats": [], "max_abs": None, "desync": False, "error": None}
    ia, ib = target_tensor(wire_a, target), target_tensor(wire_b, target)
    if ia is None or ib is None:
        missing = label_a if ia is None else label_b
        out["error"] = f"{target_label(wire_a, target)} has no gradient on {missing}"
        return out
    ta, tb = tensor(wire_a, ia), tensor(wire_b, ib)
    if ta is None or tb is None or list(ta["shape"]) != list(tb["shape"]):
        sa, sb = fmt_shape(ta["shape"] if ta else None), fmt_shape(tb["shape"] if tb else None)
        out["error"] = f"shapes differ: {sa} on {label_a}, {sb} on {label_b}"
        return out
    va, vb = _array(arrays_a.get(ia), "values"), _array(arrays_b.get(ib), "values")
    if va is not None and vb is not None:
        diff_full = va.reshape(ta["shape"]) - vb.reshape(tb["shape"])
        z, pad, words = view_2d(diff_full)
        diff, ref = diff_full, va
        out["basis"] = f"full values ({words})"
    else:
        ha, hb = _array(arrays_a.get(ia), "thumb"), _array(arrays_b.get(ib), "thumb")
        if ha is None or hb is None or ha.shape != hb.shape:
            out["error"] = "neither full values nor matching thumbnails were kept on both sides"
            return out
        diff, ref, z, pad = ha - hb, ha, ha - hb, None
        out["basis"] = "thumbnails (block means): values were not kept (tensors=\"full\" keeps them)"
        out["note"] = "Compared on thumbnails: equal block means do not prove equal values."
    finite = np.isfinite(diff)
    absd = np.abs(np.where(finite, diff, 0.0))
    max_abs = float(absd.max()) if diff.size else 0.0
    ref_norm = float(np.linalg.norm(np.where(np.isfinite(ref), ref, 0.0)))
    differing = int(np.count_nonzero(diff[finite])) + int((~finite).sum())
    out["max_abs"] = max_abs
    out["stats"] = [
        {"stat": "max |A − B|", "text": fmt_num(max_abs)},
        {"stat": "mean |A − B|", "text": fmt_num(float(absd.mean()) if diff.size else 0.0)},
        {"stat": "‖A − B‖ / ‖A‖", "text": fmt_num(float(np.linalg.norm(absd)) / ref_norm) if ref_norm else "—"},
        {"stat": "cells differing", "text": f"{differing} of {diff.size}"},
        {"stat": "‖A‖, ‖B‖", "text": f"{fmt_num(stat(ta, 'norm'))}, {fmt_num(stat(tb, 'norm'))}"},
    ]
    out["desync"] = across_ranks and target.startswith("param:") and (max_abs > 0 or differing > 0)
    out["figure"] = heatmap_figure(z, f"{label_a} − {label_b}", pad)
    return out

