"""The `paused` message on `/debug`: a tracer's backward stopped at a breakpoint (NOTE [Breakpoints] and
NOTE [Paused heatmaps] in tracer/record/debug/breakpoints.py). Built here for the tracer (`paused_payload`), checked
here for the server (`check_paused`), and turned here into the one-node step the view draws
(`paused_step`), so its fields are spelled in this file only.

    payload {"step": 3, "node": {"id": 12, "name": "AddmmBackward0", "module": "fc2", "source": "net.py:20"},
             "executed": 7, "thumb_budget": 4194304,
             "nodes": [<node>, ...]}                      every node run so far, in execution order
    <node>   {"id", "name", "kind", "module", "param", "source", "order", "pass", "labels", "args",
              "thumbs": true|false,                         whether its thumbnails were sent (the budget)
              "grad_outputs": [<tensor>|null, ...], "grad_inputs": [<tensor>|null, ...]|null}
    <tensor> {"shape": [64, 84], "dtype": "float32", "stats": {"min": …, "nan": 0, …}, "view": "…",
              "thumb": <`encode_array` map>|null}      non-finite statistics are null (JSON has none)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from gradscape.tracer import wire
from gradscape.tracer.protocol.envelope import MAX_MESSAGE, MAX_NAME, ProtocolError, check_envelope, count
from gradscape.tracer.wire import (
    STAT_NAMES,
    WIRE_VERSION,
    TensorArrays,
    TraceFormatError,
    WireNode,
    WireStep,
    WireTensor,
    decode_array,
    encode_array,
)

MAX_PAUSED_NODES = 200_000
MAX_PAUSED_THUMB_BYTES = MAX_MESSAGE  # thumbnails one paused message may carry, all together
MAX_THUMB_ELEMENTS = 1 << 20  # one thumbnail (the tracer's are at most `thumb`×`thumb`, 64×64 by default)
MAX_RANK = 64  # dimensions of a gradient's shape
MAX_STATS = 32
SLOTS = ("grad_outputs", "grad_inputs")

# thumbnails checked out of a paused message, by (position in "nodes", "grad_outputs"|"grad_inputs", slot)
Thumbs = dict[tuple[int, str, int], Any]


# ---------------------------------------------------------------------- building (the tracer)
def paused_tensor(shape: Sequence[int], dtype: str, stats: Mapping[str, Any], view: str) -> dict[str, Any]:
    """One gradient of the partial backward, without its thumbnail (`add_thumbs` adds it)."""
    clean = {k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None) for k, v in stats.items()}
    return {"shape": list(shape), "dtype": dtype, "stats": clean, "view": view, "thumb": None}


def paused_node(*, id: int, name: str, kind: str, module: str | None, param: str | None, source: str | None,
                order: int, pass_index: int, labels: Sequence[str] | None, args: Sequence[str] | None,
                grad_outputs: list[dict[str, Any] | None],
                grad_inputs: list[dict[str, Any] | None] | None) -> dict[str, Any]:
    """One node run so far (`order`: its position in the execution order), its thumbnails not (yet) sent."""
    return {"id": id, "name": name, "kind": kind, "module": module, "param": param, "source": source,
            "order": order, "pass": pass_index, "labels": None if labels is None else list(labels),
            "args": None if args is None else list(args), "thumbs": False, "grad_outputs": grad_outputs,
            "grad_inputs": grad_inputs}


def add_thumbs(node: dict[str, Any], thumbs: Sequence[tuple[str, int, np.ndarray]]) -> None:
    """Attach every thumbnail of one node (`(slot kind, slot, 2-D array)`), as float32 `encode_array` maps."""
    for kind, j, a in thumbs:
        node[kind][j]["thumb"] = encode_array(np.ascontiguousarray(a, dtype=np.float32))
    node["thumbs"] = True


def paused_payload(step: int, node: dict[str, Any], nodes: list[dict[str, Any]], thumb_budget: int) -> dict[str, Any]:
    """The message's payload: paused in `step` at `node` (`{"id", "name", "module", "source"}`) after `nodes`."""
    return {"step": step, "node": node, "executed": len(nodes), "nodes": nodes, "thumb_budget": thumb_budget}


# ---------------------------------------------------------------------- checking (the server)
@contextlib.contextmanager
def _wire_errors() -> Iterator[None]:
    """The wire form's validators, reused here, raise `TraceFormatError`: on `/debug` it is a ProtocolError."""
    try:
        yield
    except TraceFormatError as exc:
        raise ProtocolError(str(exc)) from None


def check_paused(msg: Any) -> tuple[str, dict[str, Any], Thumbs]:
    """A whole `paused` message: (its run, the pause as the server keeps it: `{"step", "node", "executed",
    "nodes"}`, the thumbnails apart). Raises `ProtocolError` naming the first field that is wrong."""
    payload = check_envelope(msg, "paused")
    where = "paused.payload"
    step = count(payload.get("step"), f"{where}.step")
    node = payload.get("node")
    if not isinstance(node, dict) or not isinstance(node.get("id"), int) or not isinstance(node.get("name"), str):
        raise ProtocolError(f"{where}.node: expected {{id: int, name: str, module, source}}")
    executed = count(payload.get("executed"), f"{where}.executed")
    nodes = payload.get("nodes")
    if not isinstance(nodes, list) or len(nodes) > MAX_PAUSED_NODES or not all(isinstance(n, dict) for n in nodes):
        raise ProtocolError(f"{where}.nodes: expected a list of at most {MAX_PAUSED_NODES} maps")
    listing, thumbs = check_paused_nodes(nodes)
    info = {"id": node["id"], "name": node["name"], "module": _str_or_none(node.get("module")),
            "source": _str_or_none(node.get("source"))}
    return msg["run"], {"step": step, "node": info, "executed": executed, "nodes": listing}, thumbs


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def check_paused_nodes(nodes: list[Any]) -> tuple[list[dict[str, Any]], Thumbs]:
    """The partial backward of a `paused` message, checked: (the nodes as the JSON API lists them, without
    thumbnails; the thumbnails by (position, slot kind, slot)). Raises `ProtocolError` naming the first
    field that is wrong; the thumbnails together may not pass `MAX_PAUSED_THUMB_BYTES`."""
    listing: list[dict[str, Any]] = []
    thumbs: Thumbs = {}
    total = 0
    with _wire_errors():
        for pos, n in enumerate(nodes):
            out = _check_node(n, f"paused.payload.nodes[{pos}]")
            for kind in SLOTS:
                ts = n.get(kind)
                if ts is None and kind == "grad_inputs":
                    out[kind] = None
                    continue
                items = []
                for j, t in enumerate(wire.checked_list(ts, f"paused.payload.nodes[{pos}].{kind}")):
                    item, thumb = _check_tensor(t, f"paused.payload.nodes[{pos}].{kind}[{j}]")
                    items.append(item)
                    if thumb is not None:
                        total += len(thumb["data"])
                        if total > MAX_PAUSED_THUMB_BYTES:
                            raise ProtocolError(f"paused.payload.nodes: thumbnails of more than "
                                                f"{MAX_PAUSED_THUMB_BYTES} bytes in all")
                        thumbs[(pos, kind, j)] = thumb
                out[kind] = items
            listing.append(out)
    return listing, thumbs


def _check_node(n: dict[str, Any], w: str) -> dict[str, Any]:
    name = n.get("name")
    if not isinstance(name, str) or len(name) > MAX_NAME:
        raise ProtocolError(f"{w}.name: expected a node name, got {_shown(name)}")
    labels, args = n.get("labels"), n.get("args")
    return {"id": count(n.get("id"), f"{w}.id"), "name": name,
            "kind": wire.opt_str(n.get("kind"), f"{w}.kind"),
            "module": wire.opt_str(n.get("module"), f"{w}.module"),
            "param": wire.opt_str(n.get("param"), f"{w}.param"),
            "source": wire.opt_str(n.get("source"), f"{w}.source"),
            "order": count(n.get("order"), f"{w}.order"), "pass": count(n.get("pass", 0), f"{w}.pass"),
            "labels": None if labels is None else wire.str_list(labels, f"{w}.labels"),
            "args": None if args is None else wire.str_list(args, f"{w}.args"),
            "thumbs": n.get("thumbs") is True}


def _shown(v: Any) -> str:
    shown = repr(v)
    return shown if len(shown) <= 60 else shown[:60] + "…"


def _check_tensor(t: Any, where: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """One gradient of the partial backward: (its listing, without the thumbnail; the thumbnail's
    `encode_array` map, checked by `decode_array`, or None)."""
    if t is None:
        return None, None
    if not isinstance(t, dict):
        raise ProtocolError(f"{where}: expected a map {{shape, dtype, stats, view, thumb}} or null, got {_shown(t)}")
    shape = t.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(type(d) is int and d >= 0 for d in shape):
        raise ProtocolError(f"{where}.shape: expected a list of at most {MAX_RANK} non-negative ints, "
                            f"got {_shown(shape)}")
    dtype = t.get("dtype")
    if not isinstance(dtype, str) or len(dtype) > MAX_NAME:
        raise ProtocolError(f"{where}.dtype: expected a dtype name, got {_shown(dtype)}")
    stats = t.get("stats")
    if not isinstance(stats, dict) or len(stats) > MAX_STATS or not all(
            isinstance(k, str) and (v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)))
            for k, v in stats.items()):
        raise ProtocolError(f"{where}.stats: expected a map of statistic names to numbers or null, got {_shown(stats)}")
    view = wire.opt_str(t.get("view"), f"{where}.view")
    thumb = t.get("thumb")
    if thumb is not None:
        a = decode_array(thumb, f"{where}.thumb")
        if a.ndim != 2 or a.dtype.kind != "f" or a.size > MAX_THUMB_ELEMENTS:
            raise ProtocolError(f"{where}.thumb: expected a 2-D float array of at most {MAX_THUMB_ELEMENTS} "
                                f"elements, got {a.dtype} {list(a.shape)}")
    # JSON has no NaN: a non-finite statistic is listed as null (the tracer already sends it so)
    clean = {k: (v if v is None or isinstance(v, int) or math.isfinite(v) else None) for k, v in stats.items()}
    return {"shape": shape, "dtype": dtype, "stats": clean, "view": view or ""}, thumb


# ---------------------------------------------------------------------- one node as a step (the view)
def paused_step(doc: dict[str, Any]) -> tuple[WireStep, dict[int, TensorArrays]]:
    """One checked paused node with its thumbnails (each tensor's `"thumb"`) as a one-node step in the wire
    form the view reads (node 0, its tensors by index), and the arrays `read_arrays` would give for it
    (thumbnails only)."""
    tensors: list[WireTensor] = []
    arrays: dict[int, TensorArrays] = {}

    def ref(t: dict[str, Any] | None) -> int | None:
        if t is None:
            return None
        stats = t.get("stats") or {}
        tensors.append({"shape": t["shape"], "dtype": t["dtype"], "view": t.get("view") or "", "device": "",
                        "stats": [math.nan if stats.get(k) is None else float(stats[k]) for k in STAT_NAMES]})
        if t.get("thumb") is not None:
            arrays[len(tensors) - 1] = {"thumb": t["thumb"], "values": None}
        return len(tensors) - 1

    go = [ref(t) for t in doc["grad_outputs"]]
    gi = None if doc["grad_inputs"] is None else [ref(t) for t in doc["grad_inputs"]]
    node: WireNode = {
        "id": 0, "name": doc["name"], "kind": doc.get("kind") or "op", "module": doc.get("module"),
        "param": doc.get("param"), "source": doc.get("source"), "schema": None, "order": doc.get("order"),
        "labels": doc.get("labels") or [], "args": doc.get("args") or [], "in_shapes": [],
        "out_shapes": [None if t is None else t["shape"] for t in doc["grad_outputs"]], "out_dtypes": [],
        "gi": gi, "go": go, "t": None, "runs": []}
    step: WireStep = {"v": WIRE_VERSION, "run": "", "step": 0, "error": None, "meta": {}, "nodes": [node],
                      "edges": [], "modules": {}, "params": {}, "passes": [], "execution": [], "tensors": tensors,
                      "problems": [], "not_in_step": [], "rank": None, "world_size": None, "trigger": None,
                      "optimizer_steps": []}
    return step, arrays
