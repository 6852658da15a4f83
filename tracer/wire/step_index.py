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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
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


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def colour_values(t: Mapping[str, Any] | None) -> tuple[float | None, float | None, float | None]:
    """A tensor's norm, max |g| (max(|min|, |max|)) and fraction of exact zeros, as `app.view.colours.statistic`
    gives them; None for no tensor, or a statistic it does not have."""
    if t is None:
        return None, None, None
    st = t["stats"]
    norm = float(st[_NORM]) if len(st) > _NORM else None
    maxabs = max(abs(float(st[_MIN])), abs(float(st[_MAX]))) if len(st) > max(_MIN, _MAX) else None
    n = _numel(t["shape"])
    zeros = float(st[_ZEROS]) / n if len(st) > _ZEROS and n else None
    return norm, maxabs, zeros


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
    """The index of a step in wire form (nodes and tensors as maps)."""
    nodes, tensors = wire["nodes"], wire["tensors"]
    modules: dict[str | None, int] = {None: -1}
    names: dict[str, int] = {}
    module_code, name_code = [], []
    norm: list[float | None] = []
    maxabs: list[float | None] = []
    zeros: list[float | None] = []
    accumulated: dict[str, int] = {}
    param_node: dict[str, int] = {}
    bad = {i: (int(st[_NAN] or 0), int(st[_INF] or 0)) for i, t in enumerate(tensors)
           if len(st := t["stats"]) > _INF and (st[_NAN] or st[_INF])}
    badges: list[list[int]] = []
    sent: list[float] = []
    sent_start = [0]
    for n in nodes:
        param = n["param"]
        module_code.append(modules.setdefault(drawn_module(n["module"], param), len(modules) - 1))
        name_code.append(names.setdefault(n["name"], len(names)))
        go = n["go"]
        i = go[0] if go else None
        a, b, c = colour_values(tensors[i] if i is not None and 0 <= i < len(tensors) else None)
        norm.append(a)
        maxabs.append(b)
        zeros.append(c)
        if param:
            param_node[param] = n["id"]
            if n["order"] is not None:
                accumulated[param] = n["order"]
        gi = n["gi"] or []
        for j in gi:
            t = tensors[j] if j is not None and 0 <= j < len(tensors) else None
            sent.append(-1.0 if t is None else (colour_values(t)[0] or 0.0))
        sent_start.append(len(sent))
        if bad:
            touched = [bad[j] for j in (go or []) + gi if j in bad]
            if touched:
                badges.append([n["id"], sum(x for x, _ in touched), sum(y for _, y in touched)])
    del modules[None]
    return StepIndex(len(nodes), [m for m in modules if m is not None], module_code, list(names), name_code,
                     {"norm": norm, "maxabs": maxabs, "zeros": zeros}, badges, accumulated, param_node,
                     np.array(sent, np.float64), np.array(sent_start, np.int64))


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
