"""Arrays on the wire: a map of dtype, shape and raw little-endian bytes (`A` in the package's
docstring), checked on the way in. No pickle."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscape.tracer.wire.types import TraceFormatError, WireArray

_ALLOWED_DTYPES = {"<f2", "<f4", "<f8", "|u1", "|i1", "<i4", "<i8", "|b1"}
MAX_ARRAY_ELEMENTS = 1 << 28


def encode_array(a: np.ndarray) -> WireArray:
    a = np.asarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    if a.dtype.str not in _ALLOWED_DTYPES:
        raise TraceFormatError(f"array dtype {a.dtype} cannot be stored (allowed: {sorted(_ALLOWED_DTYPES)})")
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.tobytes(order="C")}


def decode_array(d: Any, where: str = "array") -> np.ndarray:
    if not isinstance(d, dict):
        raise TraceFormatError(f"{where}: expected a map with dtype/shape/data, got {type(d).__name__}")
    dtype, shape, data = d.get("dtype"), d.get("shape"), d.get("data")
    if not isinstance(dtype, str) or dtype not in _ALLOWED_DTYPES:
        raise TraceFormatError(f"{where}: dtype {dtype!r} is not one of {sorted(_ALLOWED_DTYPES)}")
    if not isinstance(shape, list) or not all(type(s) is int for s in shape):
        raise TraceFormatError(f"{where}: shape must be a list of ints, got {shape!r}")
    if any(s < 0 for s in shape):
        raise TraceFormatError(f"{where}: negative dimension in shape {shape}")
    n = 1
    for s in shape:
        n *= s
    if n > MAX_ARRAY_ELEMENTS:
        raise TraceFormatError(f"{where}: shape {shape} has {n} elements, more than {MAX_ARRAY_ELEMENTS}")
    if not isinstance(data, (bytes, bytearray)):
        raise TraceFormatError(f"{where}: data must be bytes, got {type(data).__name__}")
    dt = np.dtype(dtype)
    if len(data) != n * dt.itemsize:
        raise TraceFormatError(f"{where}: {len(data)} bytes of data but shape {shape} × {dtype} needs "
                               f"{n * dt.itemsize}")
    return np.frombuffer(bytes(data), dtype=dt).reshape(shape)
