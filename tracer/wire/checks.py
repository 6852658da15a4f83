"""The checks of a step's values, each raising `TraceFormatError` naming the field (`where`) that is wrong:
strings, ints SQLite can hold, numbers, booleans, lists, maps, and `meta`'s plain JSON values. The step's
readers (`validation`, `field_check`, `column_check`) check with these."""

from __future__ import annotations

from typing import Any

from gradscape.tracer.wire.types import TraceFormatError
from gradscape.tracer.wire.versions import WIRE_VERSION

_INT64 = (-(1 << 63), (1 << 63) - 1)


def plain(v: Any, where: str, depth: int = 0) -> Any:
    """`meta`: what JSON can say (maps with string keys, lists, strings, numbers, booleans, nil)."""
    if depth > 32:
        raise TraceFormatError(f"{where}: nested more than 32 levels")
    if v is None or type(v) in (str, int, float, bool):
        return v
    if isinstance(v, (str, int, float)):  # subclasses (torch's version string) as their plain type
        return bool(v) if isinstance(v, bool) else str(v) if isinstance(v, str) else int(v) if isinstance(
            v, int) else float(v)
    if isinstance(v, list):
        return [plain(x, f"{where}[{k}]", depth + 1) for k, x in enumerate(v)]
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise TraceFormatError(f"{where}: key {k!r:.40} is not a string")
        return {k: plain(x, f"{where}.{k}", depth + 1) for k, x in v.items()}
    raise TraceFormatError(f"{where}: {type(v).__name__} is not allowed (strings, numbers, lists and maps only)")


def a_str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise TraceFormatError(f"{where}: expected a string, got {type(v).__name__}")
    return v


def opt_str(v: Any, where: str) -> str | None:
    return None if v is None else a_str(v, where)


def checked_list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise TraceFormatError(f"{where}: expected a list, got {type(v).__name__}")
    return v


def a_map(v: Any, where: str) -> dict[Any, Any]:
    if not isinstance(v, dict):
        raise TraceFormatError(f"{where}: expected a map, got {type(v).__name__}")
    return v


def an_int(v: Any, where: str) -> int:
    """An int that SQLite can hold (a bigger one would fail only when stored)."""
    if type(v) is not int:
        raise TraceFormatError(f"{where}: expected an int, got {type(v).__name__}")
    if not _INT64[0] <= v <= _INT64[1]:
        raise TraceFormatError(f"{where}: {v} is outside the 64-bit integer range")
    return v


def opt_int(v: Any, where: str) -> int | None:
    return None if v is None else an_int(v, where)


def opt_num(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if type(v) not in (int, float):
        raise TraceFormatError(f"{where}: expected a number or nil, got {type(v).__name__}")
    return float(v)


def a_num(v: Any, where: str) -> float:
    if type(v) not in (int, float):
        raise TraceFormatError(f"{where}: expected a number, got {type(v).__name__}")
    return float(v)


def a_bool(v: Any, where: str) -> bool:
    if type(v) is not bool:
        raise TraceFormatError(f"{where}: expected true or false, got {type(v).__name__}")
    return v


def str_list(v: Any, where: str, optional: bool = False) -> list[Any]:
    out = checked_list(v or [], where)
    for k, x in enumerate(out):
        if not (isinstance(x, str) or (optional and x is None)):
            raise TraceFormatError(f"{where}[{k}]: expected a string, got {type(x).__name__}")
    return list(out)


def versioned(d: Any) -> dict[str, Any]:
    """`d`, a map of this reader's wire version, else `TraceFormatError`."""
    if not isinstance(d, dict):
        raise TraceFormatError(f"step: expected a map, got {type(d).__name__}")
    v = d.get("v")
    if type(v) is not int or v != WIRE_VERSION:
        raise TraceFormatError(f"step: wire version {v!r} is not supported (this reader: {WIRE_VERSION})")
    return d
