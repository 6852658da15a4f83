"""The module tab: gradients at the level of layers, as the module hooks would have shown them.

For each module (`wire["modules"]`), every forward call has `grad_input` (∂L/∂ each positional
tensor argument, through this module only) and `grad_output` (∂L/∂ each tensor output): the
semantics of `register_full_backward_hook`. Its parameters' gradients come from `wire["params"]`.

The deprecated `register_backward_hook` reported something else: the grad_inputs of the module's
LAST op in forward (for `nn.Linear`, `AddmmBackward0`: bias grad, input grad, weight-ᵀ grad),
which people read as "the data, the weights and the bias". `backward_hook_note` spells that out
for the user's own module, with the slots' labels and shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gradscape.app.view.heatmaps import slot_of, stats_rows
from gradscape.app.view.ids import node_element
from gradscape.app.view.step_fields import (
    ROOT_MODULE,
    Wire,
    fmt_num,
    fmt_shape,
    max_abs,
    nonfinite,
    numel,
    stat,
    step_index,
    tensor,
)
from gradscape.tracer.wire import TensorArrays


def _tensor_row(wire: Wire, k: int, index: int | None, what: str) -> dict[str, Any]:
    """One gradient as a table row: shape, dtype and the statistics that matter for debugging."""
    t = tensor(wire, index)
    if t is None:
        return {"index": k, "what": what, "tensor": None, "shape": None, "text": f"{what}: None (no gradient)"}
    shape = list(t["shape"])
    nan, inf = nonfinite(t)
    n = numel(shape)
    zeros = stat(t, "zeros") or 0.0
    return {"index": k, "what": what, "tensor": index, "shape": shape, "dtype": t["dtype"],
            "norm": stat(t, "norm"), "min": stat(t, "min"), "max": stat(t, "max"), "mean": stat(t, "mean"),
            "std": stat(t, "std"), "nan": nan, "inf": inf, "zeros%": 100.0 * zeros / n if n else None,
            "text": f"{what} {fmt_shape(shape)} {t['dtype']}, norm {fmt_num(stat(t, 'norm'))}"}


def param_rows(wire: Wire, module: str) -> list[dict[str, Any]]:
    """The module's own parameters' gradients from this backward: `.grad` contributions."""
    mod = wire["modules"].get(module)
    params = wire["params"]
    nodes_by_param = step_index(wire).param_node
    rows = []
    for name in mod["params"] if mod else []:
        index = params.get(name)
        t = tensor(wire, index)
        row: dict[str, Any] = {"name": name, "tensor": index, "node": None, "shape": None, "stats": []}
        if name in nodes_by_param:
            row["node"] = node_element(nodes_by_param[name])
        if t is not None:
            n = numel(t["shape"])
            norm = stat(t, "norm") or 0.0
            row.update(shape=list(t["shape"]), dtype=t["dtype"], norm=norm,
                       rms=norm / math.sqrt(n) if n else None, maxabs=max_abs(t), stats=stats_rows(t))
        rows.append(row)
    return rows


def _last_op_slots(wire: Wire, node_id: int) -> list[dict[str, Any]]:
    node = wire["nodes"][node_id]
    labels = node["labels"]
    out = []
    for j, index in enumerate(node["gi"] or []):
        t = tensor(wire, index)
        out.append({"slot": j, "label": labels[j] if j < len(labels) else f"input {j}", "tensor": index,
                    "shape": None if t is None else list(t["shape"])})
    return out


def backward_hook_note(wire: Wire, module: str) -> dict[str, Any]:
    """What the deprecated `Module.register_backward_hook` would have reported for this module:
    the grad_inputs of `calls[0].last`, the last op its forward ran, slot by slot."""
    mod = wire["modules"].get(module)
    calls = mod["calls"] if mod else []
    if not calls:
        return {"node": None, "slots": [], "text": (
            f"{module} was never called in forward (its parameters were used directly), so no module hook "
            "of either kind would have fired")}
    last = calls[0]["last"]
    if last is None:
        return {"node": None, "slots": [], "text": f"{module}'s forward ran no op that needs a gradient"}
    node = wire["nodes"][last]
    slots = _last_op_slots(wire, last)
    listed = ", ".join(f"{s['label']} {fmt_shape(s['shape']) if s['tensor'] is not None else '(None)'}"
                       for s in slots)
    inputs = [tensor(wire, i) for i in calls[0]["gi"]]
    full = ", ".join("None" if t is None else fmt_shape(t["shape"]) for t in inputs) or "nothing"
    text = (f"register_backward_hook (deprecated) would have shown grad_input = the grad_inputs of "
            f"{node['name']} ({node_element(last)}), the last op of {module}'s forward: ({listed}). That is not the "
            f"gradient w.r.t. the module's input; register_full_backward_hook gives grad_input = ({full}).")
    return {"node": node_element(last), "name": node["name"], "slots": slots, "text": text}


PARAM_COLUMNS = ("parameter", "shape", "‖g‖₂", "RMS", "max |g|", "mean", "nan", "inf")


def param_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The parameter gradients as a display table: `{"columns", "rows"}` of strings (shapes as
    `[30×20]`, numbers to 4 significant digits)."""
    out = []
    for r in rows:
        stats = {s["stat"]: s for s in r.get("stats") or []}
        if r.get("shape") is None:
            out.append([r["name"], "—", "no gradient", "", "", "", "", ""])
            continue
        out.append([r["name"], f"{fmt_shape(r['shape'])} {r.get('dtype') or ''}".rstrip(), fmt_num(r.get("norm")),
                    fmt_num(r.get("rms")), fmt_num(r.get("maxabs")),
                    *(stats[k]["text"] if k in stats else "—" for k in ("mean", "nan", "inf"))])
    return {"columns": list(PARAM_COLUMNS), "rows": out}


def module_tensors(wire: Wire, module: str) -> list[int]:
    """The tensor indices `module_detail` shows as heatmaps: what to pass to `read_arrays`."""
    mod = wire["modules"].get(module)
    found = {i for call in (mod["calls"] if mod else []) for i in call["go"] + call["gi"] if i is not None}
    return sorted(found)


def module_detail(wire: Wire, module: str, arrays: Mapping[int, TensorArrays] | None = None) -> dict[str, Any]:
    """Everything the module tab shows for one module: per call, its grad_output and grad_input
    as rows (statistics) and as slots (heatmap figure, label, shape and statistics, the same as the
    node tab's; `arrays` from `read_arrays(run, step, module_tensors(...))`, without it statistics
    only); its parameters' gradients (`params` rows and a display `param_table`); and the
    `register_backward_hook` note."""
    modules = wire["modules"]
    if module not in modules:
        raise KeyError(f"no module {module!r} in this step (modules: {', '.join(list(modules)[:8])}…)")
    mod = modules[module]
    got = arrays or {}
    calls = []
    for c, call in enumerate(mod["calls"]):
        go, gi, last = call["go"], call["gi"], call["last"]
        calls.append({
            "call": c, "last": None if last is None else node_element(last),
            "grad_output": [_tensor_row(wire, k, i, f"∂L/∂output {k}") for k, i in enumerate(go)],
            "grad_input": [_tensor_row(wire, k, i, f"∂L/∂input {k}") for k, i in enumerate(gi)],
            "slots": {
                "grad_output": [slot_of(wire, "grad_output", k, i, f"∂L/∂output {k}", got)
                                for k, i in enumerate(go)],
                "grad_input": [slot_of(wire, "grad_input", k, i, f"∂L/∂input {k} (positional argument {k})", got)
                               for k, i in enumerate(gi)],
            },
        })
    params = param_rows(wire, module)
    return {"module": module, "type": mod["type"], "calls": calls, "params": params,
            "param_table": param_table(params), "backward_hook": backward_hook_note(wire, module)}


def module_table(wire: Wire) -> list[dict[str, Any]]:
    """One summary row per module (the tab's list): type, calls, parameters and the norms of the
    gradient at its output and input (first call)."""
    rows = []
    for name, mod in wire["modules"].items():
        calls = mod["calls"]
        go = [tensor(wire, i) for i in calls[0]["go"]] if calls else []
        gi = [tensor(wire, i) for i in calls[0]["gi"]] if calls else []
        nan = sum(sum(nonfinite(t)) for t in go + gi)
        rows.append({
            "module": name, "type": mod["type"], "calls": len(calls), "params": len(mod["params"]),
            "grad_output": ", ".join(fmt_shape(t["shape"]) if t else "None" for t in go),
            "grad_output_norm": max((stat(t, "norm") or 0.0 for t in go if t), default=None),
            "grad_input": ", ".join(fmt_shape(t["shape"]) if t else "None" for t in gi),
            "grad_input_norm": max((stat(t, "norm") or 0.0 for t in gi if t), default=None),
            "nonfinite": nan, "root": name == ROOT_MODULE,
        })
    return rows
