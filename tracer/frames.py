"""A step as Apache Arrow tables, for pandas, Polars, DuckDB or any engine that reads Arrow.

NOTE [Step tables for analysis]
    `st.nodes_table()`, `st.gradients_table()` and `st.params_table()` give a `StepTrace` (a live one, or
    one `gradscape.load` read back from a trace file) as `pyarrow.Table`s:

      nodes      one row per autograd node: `node` (its id), `name`, `kind`, `module`, `param`, `source`,
                 `order` (its first run's place in the execution order, null if it did not run),
                 `time_us`, `runs` (how many times it ran).
      gradients  one row per gradient slot of each run of each node: `node`, `name`, `module`, `pass`,
                 `order`, `direction` (`"grad_output"`: what arrived for forward output `slot`;
                 `"grad_input"`: what the node sent on for forward input `slot`, NOTE [Slot order] in
                 _model.py), `slot`, `label` (the slot's name as the page shows it, for a grad_input),
                 `shape`, `dtype`, `device`, `numel` and the statistics (`STAT_NAMES`: `min max mean std
                 norm` as float64 over the finite elements, `nan inf zeros` as counts). A slot with no
                 gradient (None) has no row.
      params     one row per parameter: `param`, `shape`, `dtype`, and the statistics of the gradient the
                 optimizer stepped with (`StepTrace.params`).

    Join `gradients` to `nodes` on `node`. pyarrow is not one of gradscape's dependencies: install it
    (`pip install pyarrow`, or the `tables` extra) to use these; the tables convert with
    `.to_pandas()` / `polars.from_arrow(...)`, and DuckDB queries them by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `StepTrace`'s table methods import this module, not the other way
    import pyarrow as pa

    from gradscape.tracer._model import StepTrace, TensorTrace

_COUNTS = ("nan", "inf", "zeros")


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as exc:
        raise ImportError("a step's tables are Apache Arrow tables: install pyarrow "
                          "(`pip install pyarrow` or `pip install gradscape[tables]`)") from exc
    return pyarrow


def _stat_fields(pa: Any, names: Sequence[str]) -> list[Any]:
    return [pa.field(k, pa.int64() if k in _COUNTS else pa.float64()) for k in names]


def _stats(t: TensorTrace, names: Sequence[str]) -> list[Any]:
    out: list[Any] = []
    for k in names:
        v = t.stats.get(k)
        out.append(None if v is None else int(v) if k in _COUNTS else float(v))
    return out


def _table(pa: Any, schema: Any, rows: Iterable[list[Any]]) -> pa.Table:
    """`rows` (lists in `schema`'s order) as a table, made column by column."""
    columns: list[list[Any]] = [[] for _ in schema.names]
    for row in rows:
        for col, v in zip(columns, row):
            col.append(v)
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)


def nodes_table(st: StepTrace) -> pa.Table:
    """One row per autograd node of `st` (NOTE [Step tables for analysis])."""
    pa = _pyarrow()
    schema = pa.schema([("node", pa.int64()), ("name", pa.string()), ("kind", pa.string()),
                        ("module", pa.string()), ("param", pa.string()), ("source", pa.string()),
                        ("order", pa.int64()), ("time_us", pa.float64()), ("runs", pa.int64())])
    return _table(pa, schema, ([n.id, n.name, n.kind, n.module, n.param, n.source, n.order, n.time_us, len(n.runs)]
                               for n in st.nodes))


def _slot_rows(st: StepTrace, names: Sequence[str]) -> Iterable[list[Any]]:
    for n in st.nodes:
        for run in n.runs:
            for direction, slots in (("grad_output", run.grad_outputs), ("grad_input", run.grad_inputs or [])):
                for j, t in enumerate(slots):
                    if t is None:
                        continue
                    label = n.input_labels[j] if direction == "grad_input" and j < len(n.input_labels) else None
                    yield [n.id, n.name, n.module, run.pass_index, run.order, direction, j, label,
                           list(t.shape), t.dtype, t.device, t.numel, *_stats(t, names)]


def gradients_table(st: StepTrace, stat_names: Sequence[str]) -> pa.Table:
    """One row per gradient slot of each run of each node of `st` (NOTE [Step tables for analysis]), with the
    statistics `stat_names` (`STAT_NAMES`, which `StepTrace.gradients_table` passes)."""
    pa = _pyarrow()
    schema = pa.schema([("node", pa.int64()), ("name", pa.string()), ("module", pa.string()),
                        ("pass", pa.int64()), ("order", pa.int64()), ("direction", pa.string()),
                        ("slot", pa.int64()), ("label", pa.string()), ("shape", pa.list_(pa.int64())),
                        ("dtype", pa.string()), ("device", pa.string()), ("numel", pa.int64()),
                        *_stat_fields(pa, stat_names)])
    return _table(pa, schema, _slot_rows(st, stat_names))


def params_table(st: StepTrace, stat_names: Sequence[str]) -> pa.Table:
    """One row per parameter gradient of `st`, with the statistics `stat_names` (NOTE [Step tables for
    analysis])."""
    pa = _pyarrow()
    schema = pa.schema([("param", pa.string()), ("shape", pa.list_(pa.int64())), ("dtype", pa.string()),
                        *_stat_fields(pa, stat_names)])
    return _table(pa, schema, ([name, list(t.shape), t.dtype, *_stats(t, stat_names)] for name, t in st.params.items()))
