"""A step's index: what the page reads of every node to open a step, kept beside the step in the trace file.

NOTE [Step index]
    The page opens a step folded: it needs, for every node, the module it is drawn inside (to fold), the
    statistic of the gradient that arrived at it (to colour the folds and set the colour range), its name
    and the order autograd ran it (the player), and which nodes touched a NaN or an Inf. Reading those
    from the step's wire form meant decoding every node and tensor map: a 100,002-node step of the
    LSTMCell loop is 2.3 million Python objects and 0.55 s, before any fold. So the store writes this
    index with each step (`tracer.index_store`), a few flat lists, and the page reads it instead, along
    with the node and tensor maps of only the nodes it draws or shows (`tracer.wire.lazy`).

    Each field is what the view's per-node readers give (`app.view.step_fields`): `module_code[k]` is
    node k's drawn module (`drawn_module`: its module, else the owner of its parameter; the model's own
    forward, `<root>`, and no module at all are the top level, -1) as an index into `modules`; `values`
    holds per colouring the statistic of `go[0]` (None when no gradient arrived); `badges` lists
    `[node, nan, inf]` for the nodes whose `go` or `gi` counted a NaN or an Inf; `accumulated` maps a
    parameter to the order of the last AccumulateGrad node that ran for it, `param_node` to the last node
    that names it. tests/test_step_index.py holds it to the wire form it was made from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import chain
from typing import Any

import numpy as np

from gradscape.tracer._model import STAT_NAMES

INDEX_VERSION = 1
ROOT_MODULE = "<root>"
COLOURINGS = ("norm", "maxabs", "zeros")
_MIN, _MAX, _NORM, _NAN, _INF, _ZEROS = (STAT_NAMES.index(s) for s in ("min", "max", "norm", "nan", "inf", "zeros"))


def param_owner(param: str) -> str:
    """The module that owns a parameter: `blocks.3.attn.qkv.weight` → `blocks.3.attn.qkv`."""
    return param.rsplit(".", 1)[0] if "." in param else ROOT_MODULE


def drawn_module(module: str | None, param: str | None) -> str | None:
    """The module a node is drawn inside, or None for the top level: its own module, else (AccumulateGrad
    nodes run outside any forward) the module that owns its parameter; `<root>` is the top level."""
    if module is None and param:
        module = param_owner(param)
    return None if module in (None, ROOT_MODULE) else module


@dataclass
class StepIndex:
    """What the page reads of every node of a step (NOTE [Step index])."""

    n_nodes: int
    modules: list[str]  # drawn modules, by first node
    module_code: list[int]  # per node: index into `modules`, -1 at the top level
    names: list[str]  # distinct node names, by first node
    name_code: list[int]  # per node: index into `names`
    values: dict[str, list[float | None]]  # per colouring (`COLOURINGS`): per node, the statistic of go[0]
    badges: list[list[int]]  # [node, NaN count, Inf count] of the nodes that touched one
    accumulated: dict[str, int]  # parameter -> order of its AccumulateGrad node that ran
    param_node: dict[str, int]  # parameter -> the node that names it
    sent: np.ndarray  # float64: the norm of each node's gi slot in turn (-1: no gradient; 0 for no norm)
    sent_start: np.ndarray  # int64, n_nodes + 1: where each node's slots start in `sent`

    def module_of(self, k: int) -> str | None:
        c = self.module_code[k]
        return None if c < 0 else self.modules[c]

    def sent_norms(self, slots: Sequence[Sequence[int]]) -> list[float]:
        """The norms of the gradients that the wire edges `slots` ([src, dst, slot] each) carried, in their
        order, the slots that carried none left out."""
        s = np.asarray(slots, dtype=np.int64).reshape(-1, 3)
        src, slot = s[:, 0], s[:, 2]
        start = self.sent_start[src]
        ok = slot < self.sent_start[src + 1] - start
        norms = self.sent[start[ok] + slot[ok]]
        return [float(v) for v in norms[norms != -1.0]]


def index_from_wire(wire: Mapping[str, Any]) -> StepIndex:
    """The index of a step in wire form (nodes and tensors as maps): one pass over the nodes for what each
    names, and the tensors' statistics read as one array."""
    nodes, tensors = wire["nodes"], wire["tensors"]
    modules: dict[str | None, int] = {None: -1}
    names: dict[str, int] = {}
    module_code, name_code, arrived, gi_flat, sent_start = [], [], [], [], [0]
    accumulated: dict[str, int] = {}
    param_node: dict[str, int] = {}
    for n in nodes:
        param = n["param"]
        module_code.append(modules.setdefault(drawn_module(n["module"], param), len(modules) - 1))
        name_code.append(names.setdefault(n["name"], len(names)))
        go, gi = n["go"], n["gi"]
        arrived.append(go[0] if go else None)
        if gi:
            gi_flat.extend(gi)
        sent_start.append(len(gi_flat))
        if param:
            param_node[param] = n["id"]
            if n["order"] is not None:
                accumulated[param] = n["order"]
    del modules[None]
    stats = stats_of(tensors)
    rows, has = _rows(arrived, len(tensors))
    sent_rows, sent_has = _rows(gi_flat, len(tensors))
    sent = np.where(sent_has, stats[sent_rows, _NORM], -1.0)  # and -0.0 as 0.0 below, as `norm or 0.0` gives it
    return StepIndex(len(nodes), [m for m in modules if m is not None], module_code, list(names), name_code,
                     colour_values(stats, rows, has, _numel(tensors, rows, has)), _badges(wire, stats),
                     accumulated, param_node, np.where(sent == 0.0, 0.0, sent), np.array(sent_start, np.int64))


def stats_of(tensors: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Every tensor's statistics, a row each (`STAT_NAMES`' columns; one more row of NaN, for no tensor)."""
    out = np.full((len(tensors) + 1, len(STAT_NAMES)), np.nan)
    rows = [t["stats"] for t in tensors]
    if all(len(st) == len(STAT_NAMES) for st in rows):  # as the schema has it: one conversion
        out[:-1] = np.fromiter(chain.from_iterable(rows), np.float64, len(rows) * len(STAT_NAMES)).reshape(
            -1, len(STAT_NAMES))
    else:
        for k, st in enumerate(rows):
            out[k, :len(st)] = st
    return out


def _rows(refs: list[int | None], n_tensors: int) -> tuple[np.ndarray, np.ndarray]:
    """The statistics row of each tensor reference (the last, all NaN, for None or one out of range), and
    which refer to a tensor."""
    idx = np.array(refs, dtype=np.float64)  # None becomes NaN
    has = (idx >= 0) & (idx < n_tensors)
    return np.where(has, idx, n_tensors).astype(np.int64), has


def _numel(tensors: Sequence[Mapping[str, Any]], rows: np.ndarray, has: np.ndarray) -> np.ndarray:
    """The element count of each of `rows`' tensors (0 where `has` is False)."""
    return np.array([math.prod(tensors[r]["shape"]) if h else 0 for r, h in zip(rows.tolist(), has.tolist())],
                    np.float64)


def colour_values(stats: np.ndarray, rows: np.ndarray, has: np.ndarray,
                  numel: np.ndarray) -> dict[str, list[float | None]]:
    """Per colouring, each node's statistic of its `go[0]` (statistics row `rows`, of `numel` elements), as
    `app.view.colours.statistic` gives it one tensor at a time: its norm, max |g| (max(|min|, |max|)) and
    fraction of exact zeros; None for no tensor."""
    lo, hi = np.abs(stats[rows, _MIN]), np.abs(stats[rows, _MAX])
    with np.errstate(divide="ignore", invalid="ignore"):
        zeros = stats[rows, _ZEROS] / numel
    out: dict[str, list[float | None]] = {"norm": stats[rows, _NORM].tolist(),
                                          "maxabs": np.where(hi > lo, hi, lo).tolist(),  # Python's max(lo, hi)
                                          "zeros": zeros.tolist()}
    for k in np.flatnonzero(~has | (numel == 0)).tolist():
        out["zeros"][k] = None
        if not has[k]:
            out["norm"][k] = out["maxabs"][k] = None
    return out


def _badges(wire: Mapping[str, Any], stats: np.ndarray) -> list[list[int]]:
    """[node, NaN count, Inf count] of each node whose `go` or `gi` counted a NaN or an Inf."""
    flagged = np.flatnonzero((stats[:-1, _NAN] > 0) | (stats[:-1, _INF] > 0))
    if not flagged.size:
        return []
    bad = {int(i): (int(stats[i, _NAN]), int(stats[i, _INF])) for i in flagged}
    out = []
    for n in wire["nodes"]:
        touched = [bad[j] for j in (n["go"] or []) + (n["gi"] or []) if j in bad]
        if touched:
            out.append([n["id"], sum(x for x, _ in touched), sum(y for _, y in touched)])
    return out


def index_to_wire(index: StepIndex) -> dict[str, Any]:
    """The index as msgpack-ready data (`index_from_data` reads it back)."""
    out = {f.name: getattr(index, f.name) for f in fields(index)}
    return {"version": INDEX_VERSION, **out, "sent": index.sent.astype("<f8").tobytes(),
            "sent_start": index.sent_start.astype("<i8").tobytes()}


def index_from_data(d: Any) -> StepIndex | None:
    """An index stored by `index_to_wire`, or None for one of another version or form (the page then reads
    the step whole)."""
    if not isinstance(d, dict) or d.get("version") != INDEX_VERSION:
        return None
    try:
        arrays = {"sent": np.frombuffer(d["sent"], "<f8"), "sent_start": np.frombuffer(d["sent_start"], "<i8")}
        index = StepIndex(**{**{k: v for k, v in d.items() if k != "version"}, **arrays})
    except (KeyError, TypeError, ValueError):
        return None
    n = index.n_nodes
    if len(index.module_code) != n or len(index.name_code) != n or len(index.sent_start) != n + 1 or \
            any(len(index.values.get(c, ())) != n for c in COLOURINGS) or index.sent_start[-1] != len(index.sent):
        return None
    return index
