"""The run's history (every step's monitor row) in serialised form, defined once: what the tracer's
sinks send, the server checks, the store keeps and the JSON API serves. A part of the wire schema
(the rest of `tracer.wire` holds the step's); plain msgpack maps.

A batch of history rows, version `HISTORY_VERSION`:
    {"v": 1, "run": str, "rank": int|None, "params": [str],
     "rows": [{"step": int, "loss": float|None, "losses": [float|None], "grad_norm": float|None,
               "grad_norm_clipped": float|None, "param_norms": [float|None],   # aligned with "params"
               "lr": {optimizer: [float]}, "scale": float|None, "skipped": bool, "traced": bool,
               "trigger": str|None, "norms": bool}]}

`loss`: the first scalar backward root of the step (`losses`: every root, None for a non-scalar one);
`grad_norm`: the total 2-norm, unscaled, of the gradients as the backward left them (before clipping);
`grad_norm_clipped`: the total 2-norm of what the optimizers stepped with (None when none stepped);
`param_norms`: each parameter's gradient norm, as `grad_norm` (None: no gradient); `lr`: each
optimizer's learning rate per param group; `scale`: GradScaler's scale (None without one); `skipped`:
GradScaler skipped an optimizer step; `traced`: the step was traced; `trigger`: why, when no schedule
asked for it (`tracer/monitor/triggers.py`); `norms`: the step took the gradient norms (the monitor takes
them every k-th step where they would cost more than 3% of a step: NOTE [Sampled norms] in
tracer/monitor/sampling.py); without them `grad_norm`, `grad_norm_clipped` and `param_norms` are None
(a row written before this field existed had them: read as true). Floats may be NaN or infinite (that is
what a monitor is for); the JSON API writes those as null and names them in `nonfinite`.
"""

from __future__ import annotations

import math
from typing import Any, TypedDict

from gradscape.tracer.wire.checks import opt_num
from gradscape.tracer.wire.codec import pack
from gradscape.tracer.wire.types import TraceFormatError

HISTORY_VERSION = 1
MAX_HISTORY_ROWS = 10_000  # rows in one batch
TRIGGERS = ("nonfinite", "loss_spike", "grad_spike", "amp_skipped")


class WireHistoryRow(TypedDict):
    step: int
    loss: float | None
    losses: list[float | None]
    grad_norm: float | None
    grad_norm_clipped: float | None
    param_norms: list[float | None]
    lr: dict[str, list[float]]
    scale: float | None
    skipped: bool
    traced: bool
    trigger: str | None
    norms: bool


class WireHistory(TypedDict):
    v: int
    run: str
    rank: int | None
    params: list[str]
    rows: list[WireHistoryRow]


def history_to_wire(run: str, rank: int | None, params: list[str], rows: list[WireHistoryRow]) -> WireHistory:
    return {"v": HISTORY_VERSION, "run": run, "rank": rank, "params": list(params), "rows": list(rows)}


def history_parts(batch: WireHistory, limit: int = 4 * 1024 * 1024) -> list[bytes]:
    """The batch packed (msgpack) in parts of at most `limit` bytes each, split by rows (one `history`
    message each: `tracer.protocol`)."""
    data = pack(batch)
    if len(data) <= limit or len(batch["rows"]) <= 1:
        return [data]
    half = len(batch["rows"]) // 2
    return [p for rows in (batch["rows"][:half], batch["rows"][half:])
            for p in history_parts({**batch, "rows": rows}, limit)]


def row_as_dict(row: WireHistoryRow, params: list[str]) -> dict[str, Any]:
    """A row as `TraceStore.history` gives it: `param_norms` keyed by parameter name."""
    out: dict[str, Any] = dict(row)
    out["param_norms"] = {n: v for n, v in zip(params, row["param_norms"]) if v is not None}
    return out


def history_from_wire(d: Any) -> WireHistory:
    """Check a batch; raises `TraceFormatError` naming the first field that is wrong."""
    if not isinstance(d, dict):
        raise TraceFormatError(f"history: expected a map, got {type(d).__name__}")
    if d.get("v") != HISTORY_VERSION or type(d.get("v")) is not int:
        raise TraceFormatError(f"history: version {d.get('v')!r} is not supported (this reader: {HISTORY_VERSION})")
    run = d.get("run")
    if not isinstance(run, str) or not run:
        raise TraceFormatError("history.run: expected a non-empty string")
    rank = d.get("rank")
    if rank is not None and (type(rank) is not int or rank < 0):
        raise TraceFormatError(f"history.rank: expected an int >= 0 or nil, got {rank!r}")
    params = d.get("params")
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise TraceFormatError("history.params: expected a list of strings")
    rows = d.get("rows")
    if not isinstance(rows, list) or len(rows) > MAX_HISTORY_ROWS:
        raise TraceFormatError(f"history.rows: expected a list of at most {MAX_HISTORY_ROWS} rows")
    checked = [_row(r, f"history.rows[{k}]", len(params)) for k, r in enumerate(rows)]
    return {"v": HISTORY_VERSION, "run": run, "rank": rank, "params": list(params), "rows": checked}


def _row(r: Any, where: str, n_params: int) -> WireHistoryRow:
    if not isinstance(r, dict):
        raise TraceFormatError(f"{where}: expected a map, got {type(r).__name__}")
    step = r.get("step")
    if type(step) is not int or not 0 <= step < (1 << 63):
        raise TraceFormatError(f"{where}.step: expected an int in 0..2^63-1, got {step!r}")
    norms = _nums(r.get("param_norms", []), f"{where}.param_norms")
    if len(norms) not in (0, n_params):
        raise TraceFormatError(f"{where}.param_norms: {len(norms)} values for {n_params} parameters")
    lr = r.get("lr") or {}
    if not isinstance(lr, dict) or not all(isinstance(k, str) for k in lr):
        raise TraceFormatError(f"{where}.lr: expected a map of optimizer name to a list of numbers")
    trigger = r.get("trigger")
    if trigger is not None and trigger not in TRIGGERS:
        raise TraceFormatError(f"{where}.trigger: expected one of {list(TRIGGERS)} or nil, got {trigger!r}")
    if type(r.get("norms", True)) is not bool:
        raise TraceFormatError(f"{where}.norms: expected true or false")
    for key in ("skipped", "traced"):
        if type(r.get(key, False)) is not bool:
            raise TraceFormatError(f"{where}.{key}: expected true or false")
    return {"step": step, "loss": opt_num(r.get("loss"), f"{where}.loss"),
            "losses": _nums(r.get("losses", []), f"{where}.losses"),
            "grad_norm": opt_num(r.get("grad_norm"), f"{where}.grad_norm"),
            "grad_norm_clipped": opt_num(r.get("grad_norm_clipped"), f"{where}.grad_norm_clipped"),
            "param_norms": norms,
            "lr": {k: [x for x in _nums(v, f"{where}.lr[{k!r}]") if x is not None] for k, v in lr.items()},
            "scale": opt_num(r.get("scale"), f"{where}.scale"), "skipped": bool(r.get("skipped", False)),
            "traced": bool(r.get("traced", False)), "trigger": trigger, "norms": bool(r.get("norms", True))}


def _nums(v: Any, where: str) -> list[float | None]:
    if not isinstance(v, list):
        raise TraceFormatError(f"{where}: expected a list, got {type(v).__name__}")
    return [opt_num(x, f"{where}[{k}]") for k, x in enumerate(v)]


def json_row(row: dict[str, Any]) -> dict[str, Any]:
    """A `TraceStore.history` row as JSON can say it: NaN and infinities become null, and the row's
    `nonfinite` lists which of `loss`, `grad_norm`, `grad_norm_clipped`, `scale` and `param_norms.<name>`
    were NaN or infinite."""
    bad: list[str] = []

    def fin(v: Any, name: str) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            bad.append(name)
            return None
        return v

    out = {k: fin(v, k) for k, v in row.items() if k not in ("param_norms", "losses", "lr")}
    out["losses"] = [fin(v, f"losses[{k}]") for k, v in enumerate(row.get("losses", []))]
    out["param_norms"] = {n: fin(v, f"param_norms.{n}") for n, v in row.get("param_norms", {}).items()}
    out["lr"] = {k: [fin(x, f"lr.{k}") for x in v] for k, v in row.get("lr", {}).items()}
    out["nonfinite"] = bad
    return out
