"""Where a node's gradient slots are in a natively recorded step's tensor table (NOTE [Step tables] in
tables.py), looked up for many slots without making a `NodeTrace` or a `TensorTrace`."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscape.tracer.record.tables import StepTables


def slot_rows(t: StepTables, nodes: list[int], sent: list[bool], j: list[int]) -> list[int]:
    """The tensor-table row of slot `j[i]` of node `nodes[i]`'s `grad_inputs` (`sent[i]`) or `grad_outputs` in
    its first run (what its `NodeTrace` holds there); -1 for none. A few are looked up one by one (numpy's
    set-up costs more than they do), from a small graph's columns as lists when those were made, else from
    the arrays; many are looked up all at once."""
    if len(nodes) <= _FEW_SLOTS and len(t.name_code) <= _SMALL_GRAPH:
        if t._lists is None:  # not worth making the lists for a few: read the arrays
            return [_array_row(t, k, s, i) for k, s, i in zip(nodes, sent, j)]
        c = t.lists()
        return [_listed_row(c, k, s, i) for k, s, i in zip(nodes, sent, j)]
    nd, sd, jd = np.asarray(nodes, np.int64), np.asarray(sent, bool), np.asarray(j, np.int64)
    rows = np.full(len(nd), -1, np.int64)
    ok = (nd >= 0) & (nd < len(t.run_start) - 1)
    safe = np.where(ok, nd, 0)
    if not len(t.run_rows):
        return rows.tolist()
    start = t.run_start[safe]
    ok &= start < t.run_start[safe + 1]
    r = t.runs[t.run_rows[np.where(ok, start, 0)]]
    off = np.where(sd, r["gi_off"], r["go_off"]).astype(np.int64)
    n = np.where(sd, r["gi_n"], r["go_n"]).astype(np.int64)
    ok &= (jd >= 0) & (jd < n)
    rows[ok] = t.slots[off[ok] + jd[ok]]
    return rows.tolist()


_FEW_SLOTS = 16
_SMALL_GRAPH = 4096


def _listed_row(c: Any, k: int, sent: bool, j: int) -> int:
    """`slot_rows` of one slot, from the tables' columns as lists (`StepTables.lists()`)."""
    if not 0 <= k < len(c.run_start) - 1:
        return -1
    start = c.run_start[k]
    if start == c.run_start[k + 1]:
        return -1
    pos = c.run_rows[start]
    off, n = (c.gi_off[pos], c.gi_n[pos]) if sent else (c.go_off[pos], c.go_n[pos])
    return c.slots[off + j] if 0 <= j < n else -1


def _array_row(t: StepTables, k: int, sent: bool, j: int) -> int:
    """`_listed_row` from the tables' arrays, element by element."""
    if not 0 <= k < len(t.run_start) - 1:
        return -1
    start = int(t.run_start[k])
    if start == int(t.run_start[k + 1]):
        return -1
    r = t.runs[int(t.run_rows[start])]
    off, n = (int(r["gi_off"]), int(r["gi_n"])) if sent else (int(r["go_off"]), int(r["go_n"]))
    return int(t.slots[off + j]) if 0 <= j < n else -1
