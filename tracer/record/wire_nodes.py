"""A natively recorded step's nodes straight to their wire form, from its tables.

NOTE [Nodes to the wire]
    Writing a step (the trace file, the live socket, the HTML file) turns every node into its wire map
    (`tracer.wire.codec`). Going through the `LazyNodes` made a `NodeTrace`, its `NodeRun`s and a
    `TensorTrace` per gradient only to read them once: at 100k nodes that was 1.3-1.9 s of a 5 s write,
    and looking each tensor up by `id()` another second. Here the node maps are made from the columns
    (NOTE [Step tables] in tables.py), and a gradient summary is found by its row in the tensor table:
    its wire index is assigned the first time a slot names it, in the order the codec visits a
    `NodeTrace` (first run's `gi`, its `go`, then every later run's `go` and `gi`), so the wire form is
    the same, byte for byte, as the one made from materialised nodes (tests/test_wire_nodes.py).
    A node or tensor already made is written from its object: whatever was done to it since (the
    thumbnail budget, a reader that kept it) is what is written, and the codec's `id()` table keeps one
    index for it when a module call or a pass names the same object later.
"""

from __future__ import annotations

from typing import Any

from gradscape.tracer.record.tables import LazyNodes
from gradscape.tracer.summary.fastpath import KERNEL_PLANS
from gradscape.tracer.wire.codec import node_to_wire
from gradscape.tracer.wire.types import WireNode


class _SummaryRefs:
    """Wire index of each row of the step's tensor table, assigned on first use."""

    def __init__(self, lazy: LazyNodes, tab: Any) -> None:
        self.table = lazy.tables.tensors
        self.tab = tab
        self.index: list[int] = [-1] * len(self.table)
        self.plans = self.table.plan.tolist()
        self.made = self.table._made
        self.stats: list[list[float]] | None = None  # every row's statistics, computed when first needed

    def of(self, k: int) -> int:
        i = self.index[k]
        if i < 0:
            p = self.plans[k]
            if p < 0 or self.made[k] is not None:  # a Python summary, or one already made: by the object
                i = self.tab.ref(self.table.get(k))
            else:
                if self.stats is None:
                    self.stats = self.table.stats_rows()
                plan = KERNEL_PLANS[p]
                i = self.tab.add({"shape": list(plan.shape), "dtype": plan.dtype, "stats": self.stats[k],
                                  "view": plan.view, "device": "cpu"}, self.table.thumb_of(k))
            self.index[k] = i
        return i


def wire_nodes(lazy: LazyNodes, tab: Any) -> list[WireNode]:
    """Every node of `lazy` in its wire form (`node_to_wire`'s), tensors entered in `tab` as the codec does."""
    t = lazy.tables
    c = t.lists()
    refs = _SummaryRefs(lazy, tab)
    ref, slots = refs.of, c.slots
    tab.row_ref = ref  # the module calls' rows, written after the nodes (NOTE [Lazy module calls])

    def slot_refs(off: int, n: int) -> list[int | None]:
        return [None if s < 0 else ref(s) for s in slots[off:off + n]]

    names, codes = t.names, t.name_code.tolist()
    out: list[WireNode] = []
    for k, made in enumerate(lazy._made):
        if made is not None:
            out.append(node_to_wire(made, tab))
            continue
        runs = []
        gi0: list[int | None] | None = None
        go0: list[int | None] | None = None
        for j, pos in enumerate(c.run_rows[c.run_start[k]:c.run_start[k + 1]]):
            gi_n = c.gi_n[pos]
            if j == 0:  # the node's own gi, then go, as the codec refers to them
                gi = gi0 = None if gi_n < 0 else slot_refs(c.gi_off[pos], gi_n)
                go = go0 = slot_refs(c.go_off[pos], c.go_n[pos])
            else:
                go = slot_refs(c.go_off[pos], c.go_n[pos])
                gi = None if gi_n < 0 else slot_refs(c.gi_off[pos], gi_n)
            time_us = c.time[pos]
            runs.append([c.pass_[pos], pos, go, gi, None if time_us != time_us else time_us])
        out.append(_node(t, c, k, names[codes[k]], runs, gi0, go0))
    return out


def _node(t: Any, c: Any, k: int, name: str, runs: list[list[Any]], gi: list[int | None] | None,
          go: list[int | None] | None) -> WireNode:
    """Node `k`'s map, as `node_to_wire` makes it from the `NodeTrace` that `LazyNodes` would make (`c`:
    the tables' `lists()`)."""
    st = t.statics[k]
    outputs = t.outputs
    out_shapes, out_dtypes = outputs(k)
    in_shapes: list[list[int] | None] = []
    for child, nr in zip(c.child_id[c.child_off[k]:c.child_off[k + 1]], c.child_nr[c.child_off[k]:c.child_off[k + 1]]):
        shapes = None if child < 0 else outputs(child)[0]
        s = None if shapes is None or nr >= len(shapes) else shapes[nr]
        in_shapes.append(None if s is None else list(s))
    first = runs[0] if runs else None
    return {"id": k, "name": name, "kind": t.kinds[k], "module": t.modules[k], "param": t.params.get(k),
            "source": t.sources[k], "schema": st.schema, "order": None if first is None else first[1],
            "labels": list(st.labels), "args": list(st.args), "in_shapes": in_shapes,
            "out_shapes": [None if s is None else list(s) for s in out_shapes], "out_dtypes": list(out_dtypes),
            "gi": None if gi is None else list(gi), "go": None if go is None else list(go),
            "t": None if first is None else first[4], "runs": runs}
