"""Where the first non-finite value of a step's forward was made, found from what autograd saved.

NOTE [Where a non-finite forward value was born]
    Each walked node's output is judged non-finite, finite or unknown from what autograd saved: a
    node's `_saved_result*` is its own output, its saved inputs (`_saved_self`, `_saved_mat1`, ...,
    matched to input slots by argument name) are its children's outputs, a leaf's value is its
    AccumulateGrad node's `variable`, and a bad root is a non-finite output. Unknown outputs are then
    inferred in forward order (`_sequence_nr()`): a non-finite input makes a non-finite output
    (except through ops that can mask it, `_MASKING`); finite inputs make a finite output unless the
    op can make NaN/Inf by itself (`_RISKY`: log, sqrt, div, pow, exp, ...). The origin is a
    non-finite node whose inputs are all finite, a parameter or leaf that already held a non-finite
    value, or an input from outside the graph (data, a buffer) that was saved non-finite. Where an
    unknown risky op sits between finite inputs and a non-finite node, the risky op is named as the
    probable origin.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer.record.labels import slot_args
from gradscape.tracer.record.walk import NodeRecord

_RISKY = frozenset({
    "LogBackward0", "Log2Backward0", "Log10Backward0", "Log1PBackward0", "SqrtBackward0", "RsqrtBackward0",
    "DivBackward0", "DivBackward1", "DivBackward2", "DivBackward3", "ReciprocalBackward0",
    "PowBackward0", "PowBackward1", "PowBackward2", "ExpBackward0", "Exp2Backward0", "Expm1Backward0",
    "AcosBackward0", "AsinBackward0", "AtanhBackward0", "AcoshBackward0", "TanBackward0", "CoshBackward0",
    "SinhBackward0", "LgammaBackward0", "DigammaBackward0", "PolygammaBackward0", "XlogyBackward0",
    "XlogyBackward1", "XlogyBackward2", "ErfinvBackward0", "LogitBackward0", "ProdBackward0",
    "ProdBackward1", "CumprodBackward0", "LogdetBackward0", "LinalgInvExBackward0", "FmodBackward0",
    "RemainderBackward0", "AtanBackward0", "SpecialEntrBackward0", "LogsumexpBackward0",
})
# Forward ops that can give finite outputs from a non-finite input (they pick or replace elements)
_MASKING = frozenset({"WhereBackward0", "MaskedFillBackward0", "MaskedFillBackward1", "NanToNumBackward0",
                      "MaskedScatterBackward0", "IndexBackward0", "GatherBackward0", "SliceBackward0",
                      "SelectBackward0", "ClampMinBackward0", "ClampMaxBackward0"})

_saved_names: dict[type, tuple[str, ...]] = {}  # node class → the names of its saved tensors


def value_word(t: torch.Tensor) -> str:
    return "NaN" if bool(torch.isnan(t).any()) else "Inf"


def nonfinite(t: Any) -> bool | None:
    """True/False for a tensor holding / not holding NaN or Inf; None when it cannot be read."""
    if not isinstance(t, torch.Tensor):
        return None
    try:  # (no grad mode needed: neither reading a value nor a boolean result records anything)
        if not t.is_floating_point():
            return False if not t.is_complex() else not bool(torch.isfinite(t).all())
        if t.numel() == 1:
            return not math.isfinite(t.item())
        return not bool(torch.isfinite(t).all())
    except Exception:  # sparse, meta, a subclass that cannot answer: unknown
        return None


class ForwardSearch:
    """NOTE [Where a non-finite forward value was born], for the nodes below the bad roots."""

    def __init__(self, recs: list[NodeRecord], bad_roots: dict[int, str]) -> None:
        import networkx as nx  # (here: only a backward from a NaN or an Inf loads it)

        g = nx.DiGraph()
        for r in recs:
            g.add_node(r.id)
            for j, c in enumerate(r.children):
                if c is not None:
                    g.add_edge(r.id, c[0], slot=j)
        below: set[int] = set(bad_roots)
        for rid in bad_roots:
            below |= nx.descendants(g, rid)
        self.g = g.subgraph(below)
        self.recs = recs
        self.status: dict[int, bool] = {rid: True for rid in bad_roots}
        self.inputs_bad: list[dict[str, Any]] = []  # saved non-finite inputs from outside the graph
        self.value: dict[int, str] = dict(bad_roots)  # node id → "NaN" | "Inf" where its value was read
        for rid in below:
            try:
                self._read(recs[rid])
            except Exception:  # a node we cannot read stays unknown
                continue
        # forward order: leaves first (their sequence number is the largest), then by creation
        self.order = sorted(below, key=lambda i: (recs[i].kind not in ("param", "leaf"), recs[i].seq))
        self.certain = set(self.status)
        self._infer()
        self.bad = {i for i, s in self.status.items() if s}

    def _set(self, rid: int, bad: bool, t: torch.Tensor | None = None) -> None:
        if bad:
            self.status[rid] = True
            if t is not None and rid not in self.value:
                self.value[rid] = value_word(t)
        else:
            self.status.setdefault(rid, False)

    def _read(self, r: NodeRecord) -> None:
        node = r.node
        if r.kind in ("param", "leaf"):
            v = getattr(node, "variable", None)
            b = nonfinite(v)
            if b is not None:
                self._set(r.id, b, v)
            return
        cls = type(node)
        names = _saved_names.get(cls)
        if names is None:
            names = _saved_names[cls] = _compat.saved_tensor_names(node)
        if not names:
            return
        args = slot_args(r.name, r.kind, len(r.children))
        for arg in names:
            try:
                value = _compat.saved_tensor(node, arg)
            except Exception:  # freed, or modified in place since
                continue
            tensors = list(value) if isinstance(value, (list, tuple)) else [value]
            for t in tensors:
                b = nonfinite(t)
                if b is None:
                    continue
                if arg.startswith("result"):
                    self._set(r.id, b, t)
                    continue
                slot = args.index(arg) if arg in args else -1
                child = r.children[slot] if slot >= 0 else None
                if child is not None:
                    one_output = len(_compat.input_metadata(self.recs[child[0]].node)) == 1
                    if b or one_output:
                        self._set(child[0], b, t)
                elif b and slot >= 0:  # an input that needs no gradient: from outside the graph
                    self.inputs_bad.append({"node": r.id, "arg": arg, "value": value_word(t)})

    def _infer(self) -> None:
        g, recs, status = self.g, self.recs, self.status
        bad_input_at = {d["node"] for d in self.inputs_bad}
        for rid in self.order:
            if rid in status:
                continue
            r = recs[rid]
            if r.kind in ("param", "leaf"):
                continue
            kids = [status.get(c) for c in g.successors(rid)]
            if (True in kids or rid in bad_input_at) and r.name not in _MASKING:
                status[rid] = True
            elif all(k is False for k in kids) and rid not in bad_input_at and r.name not in _RISKY \
                    and r.kind == "op":
                status[rid] = False

    def origins(self) -> list[dict[str, Any]]:
        g, recs, status = self.g, self.recs, self.status
        found: dict[int, dict[str, Any]] = {}
        for d in self.inputs_bad:
            found.setdefault(d["node"], {"node": d["node"], "what": "input", "arg": d["arg"], "value": d["value"],
                                         "certain": True})
        for rid, s in status.items():
            if not s or rid in found:
                continue
            r = recs[rid]
            if r.kind in ("param", "leaf"):
                if rid in self.certain:
                    found[rid] = {"node": rid, "what": r.kind, "arg": None, "value": self.value.get(rid, "NaN"),
                                  "certain": True}
                continue
            kids = [status.get(c) for c in g.successors(rid)]
            if True in kids or any(d["node"] == rid for d in self.inputs_bad):
                continue
            if all(k is False for k in kids):
                found[rid] = {"node": rid, "what": "op", "arg": None, "value": self._word(rid), "certain": True}
                continue
            # unknown inputs: a risky op below, reached through unknown nodes only, is the probable origin
            probable = self._probable_below(rid)
            # a node that cannot make NaN/Inf itself, above a single risky op: that op made it
            certain = len(probable) == 1 and r.name not in _RISKY and r.kind == "op"
            for p in probable or [rid]:
                found.setdefault(p, {"node": p, "what": "op", "arg": None, "value": self._word(rid),
                                     "certain": certain})
        ordered = sorted(found.values(), key=lambda o: (recs[o["node"]].kind not in ("param", "leaf")
                                                        and o["what"] != "input", recs[o["node"]].seq))
        return ordered

    def _word(self, rid: int) -> str:
        if rid in self.value:
            return self.value[rid]
        import networkx as nx

        for c in nx.dfs_preorder_nodes(self.g.reverse(copy=False), rid):
            if c in self.value:
                return self.value[c]
        return "NaN/Inf"

    def _probable_below(self, rid: int) -> list[int]:
        g, recs, status = self.g, self.recs, self.status
        unknown = [c for c in g.successors(rid) if c not in status]
        seen: set[int] = set()
        out: list[int] = []
        while unknown:
            c = unknown.pop()
            if c in seen:
                continue
            seen.add(c)
            if recs[c].name in _RISKY:
                out.append(c)
            unknown.extend(k for k in g.successors(c) if k not in status)
        return sorted(out, key=lambda i: recs[i].seq)
