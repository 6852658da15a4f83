"""A step's index (NOTE [Step index]) from its columns (NOTE [Column document]): the same `StepIndex` that
`index_from_wire` makes of the step's maps, with numpy over the runs and slots instead of a pass over the
nodes."""

from __future__ import annotations

import math

import numpy as np

from gradscape.tracer._model import STAT_NAMES
from gradscape.tracer.wire.columns import StepColumns
from gradscape.tracer.wire.step_index import StepIndex, colour_values, drawn_module, stats_of

_NAN, _INF, _NORM = (STAT_NAMES.index(s) for s in ("nan", "inf", "norm"))


def _by_first(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of `codes` (>= 0) in the order of their first place, and each place's position in
    that order (-1 where the code is -1)."""
    out = np.full(len(codes), -1, np.int64)
    ok = codes >= 0
    if not ok.any():
        return np.zeros(0, np.int64), out
    uniq, first, inv = np.unique(codes[ok], return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    out[ok] = rank[inv]
    return uniq[np.argsort(first, kind="stable")], out


def _drawn(c: StepColumns) -> tuple[list[str], list[int]]:
    """The drawn modules by first node, and each node's code into them (-1: the top level)."""
    table = c.tables["module"]
    strs: list[str | None] = [drawn_module(m, None) for m in table]
    key = c.a["module_code"].astype(np.int64)
    for k, p in c.params.items():
        if p and table[key[k]] is None:  # an AccumulateGrad node: its parameter's owner
            strs.append(drawn_module(None, p))
            key[k] = len(strs) - 1
    ids: dict[str, int] = {}
    sid = np.array([-1 if s is None else ids.setdefault(s, len(ids)) for s in strs], np.int64)
    uniq, code = _by_first(sid[key] if len(key) else key)
    names = list(ids)
    return [names[i] for i in uniq.tolist()], code.tolist()


def _stats(c: StepColumns) -> tuple[np.ndarray, np.ndarray]:
    """Every tensor's statistics row (one more of NaN, for no tensor) and element count."""
    n = c.n_tensors
    stats = np.full((n + 1, len(STAT_NAMES)), np.nan)
    stats[:c.n_rows] = c.t["stats"].reshape(-1, len(STAT_NAMES))
    numel = np.zeros(n + 1, np.float64)
    codes = c.t["plan_code"]
    if len(c.plans):
        per_plan = np.array([math.prod(p[0]) for p in c.plans], np.float64)
        numel[:c.n_rows] = np.where(codes >= 0, per_plan[np.maximum(codes, 0)], 0.0)
    given = [*c.maps.items(), *((c.n_rows + j, m) for j, m in enumerate(c.extra))]
    if given:
        rows = [i for i, _ in given]
        stats[rows] = stats_of([m for _, m in given])[:-1]
        numel[rows] = [math.prod(m["shape"]) for _, m in given]
    return stats, numel


def index_from_columns(c: StepColumns) -> StepIndex:
    a, n = c.a, c.n_nodes
    has_run = c.run_start[:-1] < c.run_start[1:]
    first = np.where(has_run, c.by_node[np.minimum(c.run_start[:-1], max(len(c.by_node) - 1, 0))], -1)
    f = np.maximum(first, 0)
    slots = np.append(a["slots"].astype(np.int64), -1)  # the last: the slot of no gradient
    nowhere = len(slots) - 1
    go_n = np.where(has_run, a["go_n"][f], 0) if len(first) else np.zeros(0, np.int64)
    go0 = slots[np.where(go_n > 0, a["go_off"][f], nowhere)] if n else np.zeros(0, np.int64)
    gi_n = np.where(has_run, a["gi_n"][f], -1) if n else np.zeros(0, np.int64)
    gi_len = np.maximum(gi_n, 0)
    sent_start = np.concatenate([[0], np.cumsum(gi_len)]).astype(np.int64)
    gi_off = a["gi_off"][f] if n else np.zeros(0, np.int64)
    sent_slots = slots[np.repeat(gi_off - sent_start[:-1], gi_len) + np.arange(int(sent_start[-1]))]
    stats, numel = _stats(c)
    T = c.n_tensors
    rows = np.where(go0 >= 0, go0, T)
    has = go0 >= 0
    sent_rows = np.where(sent_slots >= 0, sent_slots, T)
    sent = np.where(sent_slots >= 0, stats[sent_rows, _NORM], -1.0)
    modules, module_code = _drawn(c)
    names_uniq, name_code = _by_first(a["name_code"].astype(np.int64))
    accumulated: dict[str, int] = {}
    param_node: dict[str, int] = {}
    for k in sorted(c.params):
        p = c.params[k]
        if p:
            param_node[p] = k
            if first[k] >= 0:
                accumulated[p] = int(first[k])
    return StepIndex(n, modules, module_code, [c.tables["name"][i] for i in names_uniq.tolist()],
                     name_code.tolist(), colour_values(stats, rows, has, numel[rows]),
                     _badges(c, stats, first, has_run), accumulated, param_node,
                     np.where(sent == 0.0, 0.0, sent), sent_start)


def _badges(c: StepColumns, stats: np.ndarray, first: np.ndarray, has_run: np.ndarray) -> list[list[int]]:
    """[node, NaN count, Inf count] of each node whose first run's `go` or `gi` counted a NaN or an Inf."""
    a = c.a
    bad = (stats[:-1, _NAN] > 0) | (stats[:-1, _INF] > 0)
    if not bad.any() or not has_run.any():
        return []
    s = a["slots"].astype(np.int64)
    hit = (s >= 0) & bad[np.maximum(s, 0)]
    per = [np.concatenate([[0], np.cumsum(np.where(hit, x, 0))]) for x in
           (np.ones(len(s)), stats[np.maximum(s, 0), _NAN], stats[np.maximum(s, 0), _INF])]
    k = np.flatnonzero(has_run)
    r = first[k]
    go_a, go_b = a["go_off"][r], a["go_off"][r] + a["go_n"][r]
    gi_a = a["gi_off"][r]
    gi_b = gi_a + np.maximum(a["gi_n"][r], 0)
    touched, nans, infs = ((cs[go_b] - cs[go_a]) + (cs[gi_b] - cs[gi_a]) for cs in per)
    out = np.flatnonzero(touched > 0)
    return [[int(k[i]), int(nans[i]), int(infs[i])] for i in out.tolist()]
