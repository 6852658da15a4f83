"""Thumbnails as the trace file keeps them: 8 bits a cell with their range, and a thumbnail that
repeats one already kept (the same picture, or its transpose) kept once as a reference.

NOTE [Compact thumbnails]
    A thumbnail is a picture: 253 levels between its finite minimum and maximum show what a heatmap's
    colour scale can. Each finite cell becomes the nearest of the levels lo + k·(hi − lo)/252, k in
    0..252 (so a cell is off by at most (hi − lo)/504, and lo and hi themselves are kept exactly);
    NaN, +Inf and −Inf (padding cells, and values that propagated into a block) keep their own codes,
    253, 254 and 255. Statistics are never quantised: they are computed from the gradient itself.
    A view node's gradient and what it receives are the same memory (NOTE [Views share a buffer] in
    `tracer.summary.summariser`): TBackward0's two ends give one picture and its transpose. The store
    keeps such a repeat as `{"same": k, "T": bool}`, k the index of the tensor whose row holds it.

    C = {"q8": bytes, "shape": [rows, cols], "lo": float, "hi": float} | {"same": int, "T": bool}
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from gradscape.tracer.wire.arrays import decode_array, encode_array
from gradscape.tracer.wire.types import TraceFormatError, WireArray

LEVELS = 253  # codes 0..252 for finite cells
_NAN, _POS_INF, _NEG_INF = 253, 254, 255
_TOP = LEVELS - 1


def quantise(a: np.ndarray) -> dict[str, Any]:
    """A 2-D float thumbnail as 8-bit codes with its range (C above)."""
    return quantise_same_shape(np.asarray(a, dtype=np.float64)[None])[0]


def quantise_same_shape(v: np.ndarray) -> list[dict[str, Any]]:
    """Thumbnails stacked as one (n, rows, cols) float64 array, each quantised over its own range: one
    pass of numpy for all of them (a 100k-node step keeps 50k thumbnails; one call each cost 25 µs)."""
    n = len(v)
    finite = np.isfinite(v)
    has = finite.any(axis=(1, 2))
    lo = np.where(has, np.where(finite, v, np.inf).min(axis=(1, 2), initial=np.inf), 0.0)
    hi = np.where(has, np.where(finite, v, -np.inf).max(axis=(1, 2), initial=-np.inf), 0.0)
    span = hi - lo
    ranged = (span > 0) & np.isfinite(span)
    lo3 = lo[:, None, None]
    filled = np.where(finite, v, lo3)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scaled = np.rint((filled - lo3) * (_TOP / np.where(ranged, span, 1.0))[:, None, None])
    # one value, or a range too wide for a double: the levels are lo and hi alone
    codes = np.where(ranged[:, None, None], scaled, np.where(filled > lo3, _TOP, 0))
    q = np.clip(codes, 0, _TOP).astype(np.uint8)
    q[np.isnan(v)] = _NAN
    q[v == np.inf] = _POS_INF
    q[v == -np.inf] = _NEG_INF
    shape = list(v.shape[1:])
    return [{"q8": q[i].tobytes(), "shape": shape, "lo": float(lo[i]), "hi": float(hi[i])} for i in range(n)]


def dequantise(c: Any, where: str) -> np.ndarray:
    """C (with "q8") back to a float32 array; raises `TraceFormatError` naming what is wrong."""
    shape, data, lo, hi = c.get("shape"), c.get("q8"), c.get("lo"), c.get("hi")
    if not isinstance(shape, list) or len(shape) != 2 or not all(type(s) is int and s >= 0 for s in shape):
        raise TraceFormatError(f"{where}.shape: expected [rows, cols], got {shape!r:.80}")
    if not isinstance(data, bytes) or len(data) != shape[0] * shape[1]:
        raise TraceFormatError(f"{where}.q8: expected {shape[0] * shape[1]} bytes")
    if type(lo) not in (int, float) or type(hi) not in (int, float):
        raise TraceFormatError(f"{where}.lo/hi: expected numbers")
    q = np.frombuffer(data, dtype=np.uint8).reshape(shape)
    lo, hi = float(lo), float(hi)
    out = lo + q.astype(np.float64) * ((hi - lo) / _TOP) if hi != lo else np.full(q.shape, lo)
    out[q == _TOP] = hi
    out[q == _NAN] = np.nan
    out[q == _POS_INF] = np.inf
    out[q == _NEG_INF] = -np.inf
    with np.errstate(over="ignore"):  # a double range past float32's: the picture saturates, as torch's would
        return out.astype(np.float32)


class ThumbTable:
    """The compact thumbnails of one step, in index order: each distinct picture once."""

    def __init__(self) -> None:
        self._seen: dict[tuple[bytes, tuple[int, ...]], int] = {}

    def keep_all(self, thumbs: list[WireArray | None]) -> list[dict[str, Any] | WireArray | None]:
        """What each tensor's row keeps of its thumbnail (tensor `i`'s is `thumbs[i]`): C, a reference
        to an earlier tensor's, or the wire array as it came for a thumbnail that is not 2-D (none are,
        today). The new pictures are quantised together, shape by shape."""
        kept: list[dict[str, Any] | WireArray | None] = [None] * len(thumbs)
        new: dict[tuple[int, ...], list[tuple[int, np.ndarray]]] = {}
        for idx, thumb in enumerate(thumbs):
            if thumb is None:
                continue
            a = decode_array(thumb, f"tensors[{idx}].thumb")
            if a.ndim != 2:
                kept[idx] = thumb
            elif (same := self._repeat(idx, a)) is not None:
                kept[idx] = same
            else:
                new.setdefault(a.shape, []).append((idx, a))
        for group in new.values():
            for (idx, _), c in zip(group, quantise_same_shape(np.stack([a for _, a in group]).astype(np.float64))):
                kept[idx] = c
        return kept

    def _repeat(self, idx: int, a: np.ndarray) -> dict[str, Any] | None:
        """{"same": k, "T": ...} when tensor k's picture is `a` or its transpose; else `a` is noted as idx's."""
        key = (hashlib.blake2b(a.tobytes(), digest_size=16).digest(), a.shape)
        k = self._seen.get(key)
        if k is not None:
            return {"same": k, "T": False}
        if a.shape[0] > 1 and a.shape[1] > 1:
            t = np.ascontiguousarray(a.T)
            k = self._seen.get((hashlib.blake2b(t.tobytes(), digest_size=16).digest(), t.shape))
            if k is not None:
                return {"same": k, "T": True}
        self._seen[key] = idx
        return None


def expand(stored: Any, idx: int, rows: dict[int, Any]) -> WireArray | None:
    """A row's kept thumbnail back to a float32 wire array; `rows` holds the kept thumbnails of the
    tensors it may refer to (by index). A v2 row holds the wire array itself."""
    where = f"tensors[{idx}].thumb"
    if stored is None:
        return None
    if not isinstance(stored, dict):
        raise TraceFormatError(f"{where}: expected a map, got {type(stored).__name__}")
    if "same" in stored:
        k = stored["same"]
        base = rows.get(k) if type(k) is int and k != idx else None
        if not isinstance(base, dict) or "q8" not in base:
            raise TraceFormatError(f"{where}: refers to tensor {k!r}, which holds no thumbnail")
        a = dequantise(base, f"tensors[{k}].thumb")
        return encode_array(np.ascontiguousarray(a.T) if stored.get("T") else a)
    if "q8" in stored:
        return encode_array(dequantise(stored, where))
    decode_array(stored, where)  # a v2 row: checked as it is
    return {"dtype": stored["dtype"], "shape": stored["shape"], "data": stored["data"]}


def refers_to(stored: Any) -> int | None:
    """The index a kept thumbnail refers to, or None."""
    if isinstance(stored, dict) and "same" in stored and type(stored["same"]) is int:
        return int(stored["same"])
    return None
