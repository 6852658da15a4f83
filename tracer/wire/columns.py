"""A stored step's nodes and tensors as columns (`StepColumns`): read back as the wire maps they stand for.

NOTE [Column document]
    The store writes a recorded step (NOTE [Step tables] in tracer/record/tables.py) without making its node
    and tensor maps: at 100k nodes making them took 0.8 s, packing them one by one 0.4 s and the step's
    index from them 0.2 s, more than the traced step itself. The step's document then holds, instead of
    `nodes`, `edges` and `tensors`, one field `columns` (tracer/record/wire_columns.py reads it from either
    recorder's tables; for a step whose nodes are a list, tracer/wire/trace_columns.py, NOTE [Columns of any
    step]; both lay it out through column_doc.py, its one writer):

      nodes    `n`; per node a code into a table for `name`, `kind`, `module`, `source` and `static`
               (`[schema, labels, args]`); `params` as `[node, name]` pairs; each node's slots (`child_off`,
               `child_id`, `child_nr`: the edges and the input shapes) and forward outputs (`out_off`,
               `out_ndim`, `out_dtype` with `dtypes` its names, `out_dims`); one row per run, in the order
               they ran (`run_node`, `run_pass`, `run_time`, NaN for none, and where its `go` and `gi` are
               in `slots`: `go_off`, `go_n`, `gi_off`, `gi_n`, -1 for no `gi`); `slots`, a tensor each (-1:
               None).
      tensors  `n` rows: a code into `plans` (`[shape, dtype, view, device]`) and 8 statistics (`stats`,
               `STAT_NAMES` order), or -1 and its map in `maps` (`[row, map]`); then `extra`, the maps of
               tensors past the rows (those only the modules, parameters or passes name).

    Arrays are little-endian bytes. A node's map (`StepColumns.node`) is what an earlier release's codec made of the
    same node (tests/earlier_release.py's `node_to_wire`): its first run's `gi`, `go`, order and time, every run as
    `[pass, order, go, gi, time]`; the tensors are numbered as that codec numbered them, so a step reads back the same
    from either form (tests/test_wire_columns.py). Its edges and execution order are not stored: they are the slots'
    and the runs'. The step's index is made from the columns (`tracer.wire.column_index`), with numpy and no per-node
    Python. A tracer sends a step to a server in this form too (`tracer.wire.column_check`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gradscape.tracer._model import STAT_NAMES, TensorTrace
from gradscape.tracer.wire import fast_read
from gradscape.tracer.wire.types import TraceFormatError
from gradscape.tracer.wire.validation import tensor_from_wire

COLUMNS_VERSION = 1
_I4: np.dtype[Any] = np.dtype("<i4")
_I8: np.dtype[Any] = np.dtype("<i8")
_F8: np.dtype[Any] = np.dtype("<f8")
NODE_ARRAYS: dict[str, np.dtype[Any]] = {
    "name_code": _I4, "kind_code": _I4, "module_code": _I4, "source_code": _I4, "static_code": _I4,
    "child_off": _I8, "child_id": _I4, "child_nr": _I4, "out_off": _I8, "out_ndim": _I4, "out_dtype": _I4,
    "out_dims": _I8, "run_node": _I4, "run_pass": _I4, "run_time": _F8, "go_off": _I4, "go_n": _I4,
    "gi_off": _I4, "gi_n": _I4, "slots": _I4}
TENSOR_ARRAYS: dict[str, np.dtype[Any]] = {"plan_code": _I4, "stats": _F8}
NODE_TABLES = ("n", "name", "kind", "module", "source", "static", "params", "dtypes")  # the nodes' other fields


def _arrays(d: Mapping[str, Any], spec: Mapping[str, np.dtype[Any]], where: str) -> dict[str, np.ndarray]:
    try:
        return {k: np.frombuffer(d[k], dt) for k, dt in spec.items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceFormatError(f"{where}: not the arrays of a column document: {exc!r}") from exc


class StepColumns:
    """The `columns` field of a stored step (NOTE [Column document]), read as node and tensor maps."""

    def __init__(self, d: Any) -> None:
        if not isinstance(d, dict) or d.get("version") != COLUMNS_VERSION:
            raise TraceFormatError("columns: not a column document of version 1")
        nd, td = d.get("nodes"), d.get("tensors")
        if not isinstance(nd, dict) or not isinstance(td, dict):
            raise TraceFormatError("columns: no nodes or tensors")
        self.a = _arrays(nd, NODE_ARRAYS, "columns.nodes")
        self.t = _arrays(td, TENSOR_ARRAYS, "columns.tensors")
        try:
            self.n_nodes, self.n_rows = int(nd["n"]), int(td["n"])
            self.tables = {k: list(nd[k]) for k in ("name", "kind", "module", "source", "static")}
            self.params = {int(k): str(p) for k, p in nd["params"]}
            self.dtypes = {int(c): nm for c, nm in nd["dtypes"]}
            self.plans = [(list(s), dt, view, dev) for s, dt, view, dev in td["plans"]]
            self.maps = {int(r): m for r, m in td["maps"]}
            self.extra = list(td["extra"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceFormatError(f"columns: {exc!r}") from exc
        self._check()
        a = self.a
        self.by_node = np.argsort(a["run_node"], kind="stable")  # each node's runs, in the order they ran
        self.run_start = np.searchsorted(a["run_node"][self.by_node], np.arange(self.n_nodes + 1))
        self.dim_off = np.concatenate([[0], np.cumsum(np.maximum(a["out_ndim"], 0))]).astype(np.int64)
        self._l: dict[str, Any] | None = None
        self._one: dict[str, Any] | None = None
        self._slots_all: list[list[int] | None] | None = None  # every slot's shape, once all nodes are read

    def _check(self) -> None:
        a, n, rows = self.a, self.n_nodes, self.n_rows
        per_node = ("name_code", "kind_code", "module_code", "source_code", "static_code")
        runs = ("run_node", "run_pass", "run_time", "go_off", "go_n", "gi_off", "gi_n")
        bad = [k for k in per_node if len(a[k]) != n]
        bad += [k for k in ("child_off", "out_off") if len(a[k]) != n + 1]
        bad += [k for k in runs if len(a[k]) != len(a["run_node"])]
        if len(self.t["plan_code"]) != rows or len(self.t["stats"]) != rows * len(STAT_NAMES):
            bad.append("tensors")
        if not bad:
            for k, table in zip(per_node, ("name", "kind", "module", "source", "static")):
                if len(a[k]) and (a[k].min() < 0 or a[k].max() >= len(self.tables[table])):
                    bad.append(k)
            n_t = rows + len(self.extra)
            if len(a["slots"]) and (a["slots"].min() < -1 or a["slots"].max() >= n_t):
                bad.append("slots")
            if len(a["run_node"]) and (a["run_node"].min() < 0 or a["run_node"].max() >= n):
                bad.append("run_node")
            if not self._offsets_fit():
                bad.append("offsets")
            if any(int(r) not in self.maps for r in np.flatnonzero(self.t["plan_code"] < 0)) or \
                    (rows and self.t["plan_code"].max() >= len(self.plans)) or \
                    any(not 0 <= r < rows for r in self.maps) or any(not 0 <= k < n for k in self.params):
                bad.append("plan_code, maps or params")
        if bad:
            raise TraceFormatError(f"columns: {', '.join(bad)} do not fit the step")

    def _offsets_fit(self) -> bool:
        """Every offset and count within its array, the CSR offsets from 0 and non-decreasing."""
        a, n, slots = self.a, self.n_nodes, len(self.a["slots"])
        for off, items in (("child_off", "child_id"), ("out_off", "out_ndim")):
            o = a[off]
            if o[0] != 0 or o[-1] != len(a[items]) or np.any(np.diff(o) < 0):
                return False
        gi = a["gi_n"] >= 0
        go_off, go_n, gi_off, gi_n = (a[k].astype(np.int64) for k in ("go_off", "go_n", "gi_off", "gi_n"))
        return not (np.any(a["child_id"] < -1) or np.any(a["child_id"] >= n) or np.any(a["child_nr"] < 0)
                    or np.any(a["out_ndim"] < -1) or np.any(a["out_dims"] < 0)
                    or int(np.maximum(a["out_ndim"], 0).astype(np.int64).sum()) > len(a["out_dims"])
                    or np.any(go_off < 0) or np.any(go_n < 0) or np.any(go_off + go_n > slots)
                    or np.any(gi_n < -1) or np.any(gi & (gi_off < 0)) or np.any(gi & (gi_off + gi_n > slots)))

    # ---- the columns as lists (made once, for reading every node: a numpy array read one element at a time
    # makes a scalar object a read), or read an element at a time (a few nodes: the page's)
    def _columns(self) -> dict[str, Any]:
        return {**self.a, "by_node": self.by_node, "run_start": self.run_start, "dim_off": self.dim_off}

    def lists(self) -> dict[str, Any]:
        if self._l is None:
            self._l = {k: v.tolist() for k, v in self._columns().items()}
        return self._l

    def _c(self) -> dict[str, Any]:
        if self._l is not None:
            return self._l
        if self._one is None:
            self._one = {k: _AsPython(v) for k, v in self._columns().items()}
        return self._one

    @property
    def n_tensors(self) -> int:
        return self.n_rows + len(self.extra)

    def node(self, k: int) -> dict[str, Any]:
        """Node `k`'s wire map."""
        c, tab = self._c(), self.tables
        slots = c["slots"]

        def refs(off: int, n: int) -> list[int | None]:
            return [None if s < 0 else s for s in slots[off:off + n]]

        runs = []
        for pos in c["by_node"][c["run_start"][k]:c["run_start"][k + 1]]:
            gi_n, t = c["gi_n"][pos], c["run_time"][pos]
            runs.append([c["run_pass"][pos], pos, refs(c["go_off"][pos], c["go_n"][pos]),
                         None if gi_n < 0 else refs(c["gi_off"][pos], gi_n), None if t != t else t])
        schema, labels, args = tab["static"][c["static_code"][k]]
        first = runs[0] if runs else [None] * 5
        out_shapes, out_dtypes = self._outputs(k)
        return {"id": k, "name": tab["name"][c["name_code"][k]], "kind": tab["kind"][c["kind_code"][k]],
                "module": tab["module"][c["module_code"][k]], "param": self.params.get(k),
                "source": tab["source"][c["source_code"][k]], "schema": schema, "order": first[1],
                "labels": list(labels), "args": list(args), "in_shapes": self._in_shapes(k),
                "out_shapes": [None if s is None else list(s) for s in out_shapes], "out_dtypes": out_dtypes,
                "gi": None if first[3] is None else list(first[3]), "go": None if first[2] is None else list(first[2]),
                "t": first[4], "runs": runs}

    def _outputs(self, k: int) -> tuple[list[Any], list[str | None]]:
        c = self._c()
        shapes: list[Any] = []
        dtypes: list[str | None] = []
        dims, dim_off, ndim = c["out_dims"], c["dim_off"], c["out_ndim"]
        for o in range(c["out_off"][k], c["out_off"][k + 1]):
            nd = ndim[o]
            shapes.append(None if nd < 0 else dims[dim_off[o]:dim_off[o] + nd])
            dtypes.append(self.dtypes.get(c["out_dtype"][o]))
        return shapes, dtypes

    def _in_shapes(self, k: int) -> list[list[int] | None]:
        c = self._c()
        a, b = c["child_off"][k], c["child_off"][k + 1]
        return self._slots_all[a:b] if self._slots_all is not None else self._slot_shapes(a, b)

    def _slot_shapes(self, a: int, b: int) -> list[list[int] | None]:
        """The shape of what each of the step's slots a..b-1 takes (output `child_nr` of node `child_id`);
        None for no child, no such output or no shape. One numpy pass: a node may have thousands of slots."""
        x = self.a
        child, nr = x["child_id"][a:b].astype(np.int64), x["child_nr"][a:b].astype(np.int64)
        if not len(x["out_ndim"]):
            return [None] * len(child)
        c = np.maximum(child, 0)
        first, n_out = x["out_off"][c], x["out_off"][c + 1] - x["out_off"][c]
        o = np.where((nr >= 0) & (nr < n_out), first + nr, 0)
        nd = x["out_ndim"][o].astype(np.int64)
        ok = (child >= 0) & (nr >= 0) & (nr < n_out) & (nd >= 0)
        n = np.where(ok, nd, 0)
        before = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
        flat = x["out_dims"][np.repeat(self.dim_off[o] - before, n) + np.arange(int(n.sum()))].tolist()
        out: list[list[int] | None] = []
        pos = 0
        for good, m in zip(ok.tolist(), n.tolist()):
            out.append(flat[pos:pos + m] if good else None)
            pos += m
        return out

    def nodes(self) -> list[dict[str, Any]]:
        self.lists()
        if self._slots_all is None:
            self._slots_all = self._slot_shapes(0, len(self.a["child_id"]))
        return [self.node(k) for k in range(self.n_nodes)]

    def tensor_traces(self) -> list[TensorTrace]:
        """Every tensor, its arrays left out: a row of a plan made here, the maps read by `fast_read` or, not in
        its common form, by the checked reader (`tensor_from_wire`), which names what is wrong."""
        stats = self.t["stats"].reshape(-1, len(STAT_NAMES)).tolist()
        plans = [(tuple(shape), dtype, view, device) for shape, dtype, view, device in self.plans]
        out: list[TensorTrace] = []
        for i, p in enumerate(self.t["plan_code"].tolist()):
            if i in self.maps or p < 0:
                m = self.maps[i]
                out.append(fast_read.tensor(m) or tensor_from_wire(m, f"columns.tensors.maps[{i}]"))
            else:
                shape, dtype, view, device = plans[p]
                out.append(TensorTrace(shape=shape, dtype=dtype, stats=dict(zip(STAT_NAMES, stats[i])), thumb=None,
                                       thumb_view=view, device=device, values=None))
        for j, m in enumerate(self.extra):
            out.append(fast_read.tensor(m) or tensor_from_wire(m, f"columns.tensors.extra[{j}]"))
        return out

    def execution(self) -> list[list[int]]:
        """[node, run] of every run, in the order they ran (run: the node's how-manieth)."""
        nodes = self.a["run_node"].astype(np.int64)
        k = np.empty(len(nodes), np.int64)
        k[self.by_node] = np.arange(len(nodes)) - self.run_start[nodes[self.by_node]]
        return np.stack([nodes, k], axis=1).tolist()

    def tensor(self, i: int) -> dict[str, Any]:
        """Tensor `i`'s wire map (without arrays)."""
        if i >= self.n_rows:
            return self.extra[i - self.n_rows]
        if i in self.maps:
            return self.maps[i]
        shape, dtype, view, device = self.plans[int(self.t["plan_code"][i])]
        return {"shape": list(shape), "dtype": dtype, "stats": self.t["stats"][i * 8:i * 8 + 8].tolist(),
                "view": view, "device": device}

    def tensors(self) -> list[dict[str, Any]]:
        stats = self.t["stats"].reshape(-1, len(STAT_NAMES)).tolist()
        plans, maps = self.plans, self.maps
        out = []
        for i, p in enumerate(self.t["plan_code"].tolist()):
            if i in maps or p < 0:
                out.append(maps[i])
            else:
                shape, dtype, view, device = plans[p]
                out.append({"shape": list(shape), "dtype": dtype, "stats": stats[i], "view": view, "device": device})
        return out + self.extra

    def node_fields(self) -> tuple[list[str], list[str | None], np.ndarray]:
        """Per node its name, its module and the order of its first run (-1: it never ran), as its map has
        them, from the arrays with no map made: what the page reads of every node (the find box's options)."""
        a, tab = self.a, self.tables
        starts, by_node = self.run_start, self.by_node
        first = np.full(self.n_nodes, -1, np.int64)
        ran = starts[1:] > starts[:-1]
        first[ran] = by_node[starts[:-1][ran]]
        names, modules = tab["name"], tab["module"]
        return [names[c] for c in a["name_code"].tolist()], [modules[c] for c in a["module_code"].tolist()], first

    def labels_of(self, k: int) -> list[str]:
        """Node `k`'s input slots' labels, as its map has them, with no map made (an edge's label, drawn)."""
        return list(self.tables["static"][int(self.a["static_code"][k])][1])

    def edges(self) -> list[list[int]]:
        """[node, child, slot] of every edge between the step's nodes, as the codec lists them."""
        a = self.a
        src = np.repeat(np.arange(self.n_nodes, dtype=np.int64), np.diff(a["child_off"]))
        slot = np.arange(len(a["child_id"]), dtype=np.int64) - a["child_off"][src]
        ok = a["child_id"] >= 0
        return np.stack([src[ok], a["child_id"][ok].astype(np.int64), slot[ok]], axis=1).tolist()


class _AsPython:
    """A numpy array read as a list is: an element or a slice, as Python objects."""

    __slots__ = ("a",)

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __getitem__(self, k: Any) -> Any:
        return self.a[k].tolist()
