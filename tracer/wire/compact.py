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

from collections.abc import Mapping
from typing import Any

import numpy as np

from gradscape.tracer.wire.arrays import decode_array, encode_array
from gradscape.tracer.wire.types import TraceFormatError, WireArray

LEVELS = 253  # codes 0..252 for finite cells
_NAN, _POS_INF, _NEG_INF = 253, 254, 255
_TOP = LEVELS - 1


def quantise_same_shape(v: np.ndarray) -> list[dict[str, Any]]:
    """Thumbnails stacked as one (n, rows, cols) float array, each quantised over its own range: one pass of
    numpy for all of them (a 100k-node step keeps 50k thumbnails; one call each cost 25 µs). The levels are
    computed in float64 whatever the stack's float type (a float32 cell converts exactly)."""
    quick = _quantise_finite(v) if np.isfinite(v).all() else None
    lo, hi, q = quick if quick is not None else _quantise_general(v.astype(np.float64, copy=False))
    shape, cells = list(v.shape[1:]), int(np.prod(v.shape[1:]))
    qb = q.tobytes()
    return [{"q8": qb[i * cells:(i + 1) * cells], "shape": shape, "lo": a, "hi": b}
            for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist()))]


def _quantise_finite(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`_quantise_general` of a stack whose every cell is finite, in fewer passes: the range read in the
    stack's own type (min and max are exact in any), no masks, the levels' arithmetic done in place. None
    when a picture's range overflows a double (float64 pictures only): the general path has its rule."""
    lo = v.min(axis=(1, 2)).astype(np.float64)
    hi = v.max(axis=(1, 2)).astype(np.float64)
    with np.errstate(over="ignore"):
        span = hi - lo
    if not np.isfinite(span).all():
        return None
    ranged = span > 0
    lo3 = lo[:, None, None]
    scaled = np.subtract(v, lo3, dtype=np.float64)
    scaled *= (_TOP / np.where(ranged, span, 1.0))[:, None, None]
    np.rint(scaled, out=scaled)
    # an unranged picture is its one value, lo, everywhere: (v - lo) is 0 (or -0), its code 0, as the
    # general path's `filled > lo` gives it
    np.clip(scaled, 0, _TOP, out=scaled)
    return lo, hi, scaled.astype(np.uint8)


def _quantise_general(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each float64 picture's range over its finite cells, and its codes (NOTE [Compact thumbnails])."""
    finite = np.isfinite(v)
    has = finite.any(axis=(1, 2))
    lo = np.where(has, np.where(finite, v, np.inf).min(axis=(1, 2), initial=np.inf), 0.0)
    hi = np.where(has, np.where(finite, v, -np.inf).max(axis=(1, 2), initial=-np.inf), 0.0)
    with np.errstate(over="ignore"):  # a float64 picture's range may overflow: it is then not ranged
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
    return lo, hi, q


def _checked_shape(c: Any, where: str) -> tuple[int, int]:
    """The shape of C (with "q8"), its bytes and range checked; raises `TraceFormatError` naming what is wrong."""
    shape, data, lo, hi = c.get("shape"), c.get("q8"), c.get("lo"), c.get("hi")
    if not isinstance(shape, list) or len(shape) != 2 or not all(type(s) is int and s >= 0 for s in shape):
        raise TraceFormatError(f"{where}.shape: expected [rows, cols], got {shape!r:.80}")
    if not isinstance(data, bytes) or len(data) != shape[0] * shape[1]:
        raise TraceFormatError(f"{where}.q8: expected {shape[0] * shape[1]} bytes")
    if type(lo) not in (int, float) or type(hi) not in (int, float):
        raise TraceFormatError(f"{where}.lo/hi: expected numbers")
    return shape[0], shape[1]


def dequantise_same_shape(cs: list[dict[str, Any]], shape: tuple[int, int]) -> np.ndarray:
    """Checked C's (`_checked_shape`) of one shape back to float32, as one (n, rows, cols) array, each over
    its own range."""
    q = np.frombuffer(b"".join(c["q8"] for c in cs), dtype=np.uint8).reshape(len(cs), *shape)
    lo = np.array([float(c["lo"]) for c in cs])[:, None, None]
    hi = np.array([float(c["hi"]) for c in cs])[:, None, None]
    with np.errstate(invalid="ignore", over="ignore"):
        out = np.where(hi != lo, lo + q.astype(np.float64) * ((hi - lo) / _TOP), lo)
    out = np.where(q == _TOP, hi, out)
    out[q == _NAN] = np.nan
    out[q == _POS_INF] = np.inf
    out[q == _NEG_INF] = -np.inf
    with np.errstate(over="ignore"):  # a double range past float32's: the picture saturates, as torch's would
        return out.astype(np.float32)


class ThumbTable:
    """The compact thumbnails of one step, in index order: each distinct picture once."""

    def keep_all(self, thumbs: list[WireArray | None]) -> list[dict[str, Any] | WireArray | None]:
        """`keep_arrays` of wire arrays, each checked (a malformed one raises `TraceFormatError` naming it)."""
        return self.keep_arrays([None if t is None else decode_array(t, f"tensors[{i}].thumb")
                                 for i, t in enumerate(thumbs)])

    def keep_arrays(self, pictures: list[np.ndarray | None],
                    stacked: Mapping[tuple[int, ...], tuple[np.ndarray, np.ndarray]] | None = None,
                    ) -> list[dict[str, Any] | WireArray | None]:
        """What each tensor's row keeps of its thumbnail (tensor `i`'s is `pictures[i]`, or is in `stacked`:
        shape -> (tensor indices ascending, their pictures as one stack), NOTE [Thumbnail stacks] in
        tracer/record/thumb_stacks.py): C, a reference to an earlier tensor's (`repeats`), or the wire array
        of a thumbnail that is not 2-D (none are, today). The new pictures are quantised together, shape by
        shape."""
        kept: list[dict[str, Any] | WireArray | None] = [None] * len(pictures)
        by_shape: dict[tuple[int, int], list[int]] = {}
        for idx, a in enumerate(pictures):
            if a is None or not a.size:  # an empty picture shows nothing: none is kept
                continue
            if a.ndim != 2:
                kept[idx] = encode_array(a)
            else:
                by_shape.setdefault(a.shape, []).append(idx)
        stacks = {shape: np.stack([pictures[i] for i in ix]) for shape, ix in by_shape.items()}  # type: ignore[misc]
        for shape, (at, stack) in (stacked or {}).items():
            if stack.size:
                _merge(by_shape, stacks, shape, at, stack)  # type: ignore[arg-type]
        same_as = repeats(by_shape, stacks)
        for shape, ix in by_shape.items():
            new: list[int] = []
            for idx in ix:
                if (same := same_as[idx]) is None:
                    new.append(idx)
                else:
                    kept[idx] = {"same": same[0], "T": same[1]}
            if not new:
                continue
            pos = np.searchsorted(ix, new)
            for idx, c in zip(new, quantise_same_shape(stacks[shape][pos])):
                kept[idx] = c
        return kept


def _merge(by_shape: dict[tuple[int, int], list[int]], stacks: dict[tuple[int, int], np.ndarray],
           shape: tuple[int, int], at: np.ndarray, stack: np.ndarray) -> None:
    """Add pictures `stack` of tensors `at` to the pictures of `shape`, keeping them in tensor order."""
    if shape not in by_shape:
        by_shape[shape], stacks[shape] = at.tolist(), stack
        return
    idx = np.concatenate([np.asarray(by_shape[shape], np.int64), at])
    both = np.concatenate([stacks[shape], stack])
    order = np.argsort(idx, kind="stable")
    by_shape[shape], stacks[shape] = idx[order].tolist(), both[order]


def repeats(by_shape: dict[tuple[int, int], list[int]],
            stacks: dict[tuple[int, int], np.ndarray]) -> dict[int, tuple[int, bool] | None]:
    """For each picture (its index in `by_shape[shape]`, its pixels in `stacks[shape]`): None when
    it is kept, or (k, transposed) when it repeats picture k, or k's transpose. A picture is kept when
    no earlier one has the same bytes and no earlier kept one is its transpose; a repeat refers to the
    first kept picture with its bytes, or, that one being a transpose itself, to what that one refers to.
    Bytes are compared, not values (NaN equals NaN, -0.0 differs from 0.0), as the tensors were."""
    first: dict[tuple[int, int], np.ndarray] = {}  # per shape: each picture's first index with its bytes
    keys: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # per shape: sorted unique bytes, their first
    for shape, ix in by_shape.items():
        b = _rows_as_bytes(stacks[shape])
        uniq, first_pos, inverse = np.unique(b, return_index=True, return_inverse=True)
        at = np.asarray(ix)
        first[shape] = at[first_pos[inverse.ravel()]]
        keys[shape] = (uniq, at[first_pos])
    out: dict[int, tuple[int, bool] | None] = {}
    for shape, ix in by_shape.items():
        r, c = shape
        t_first = np.full(len(ix), -1)
        other = (c, r)
        if r > 1 and c > 1 and other in keys and stacks[other].dtype == stacks[shape].dtype:
            uniq, at = keys[other]
            tb = _rows_as_bytes(stacks[shape].transpose(0, 2, 1))
            pos = np.clip(np.searchsorted(uniq, tb), 0, len(uniq) - 1)
            hit = uniq[pos] == tb
            t_first[hit] = at[pos[hit]]
        own = first[shape]
        for idx, f, t in zip(ix, own.tolist(), t_first.tolist()):
            if f == idx:  # the first with these bytes: kept unless an earlier picture is its transpose
                out[idx] = (t, True) if 0 <= t < idx else None
            else:  # a repeat of f: of f itself if f is kept, else of what f refers to
                out[idx] = None  # filled below, once every first is known
    for shape, ix in by_shape.items():
        for idx, f in zip(ix, first[shape].tolist()):
            if f != idx:
                out[idx] = (f, False) if out[f] is None else out[f]
    return out


def _rows_as_bytes(stack: np.ndarray) -> np.ndarray:
    """Each picture of an (n, rows, cols) stack as one opaque item of its bytes (compared, sorted by numpy)."""
    cells = np.ascontiguousarray(stack).reshape(len(stack), -1)
    return cells.view(np.dtype((np.void, cells.shape[1] * cells.itemsize))).ravel()


def expand_all(idx: list[int], rows: dict[int, Any]) -> dict[int, WireArray | None]:
    """`expand_pictures` as wire arrays: what `TraceStore.read_arrays` gives the page."""
    return {i: None if a is None else encode_array(a) for i, a in expand_pictures(idx, rows).items()}


def expand_pictures(idx: list[int], rows: dict[int, Any]) -> dict[int, np.ndarray | None]:
    """The kept thumbnails of tensors `idx` back to float32 arrays; `rows` holds what each row keeps (by
    index), the rows they refer to included. A v2 row holds the wire array itself (checked and read as
    it is). The 8-bit pictures are turned back together, shape by shape; a malformed one raises
    `TraceFormatError` naming it."""
    base: dict[int, int] = {}  # tensor -> the tensor whose 8-bit row holds its picture
    for i in idx:
        stored: Any = rows.get(i)
        where = f"tensors[{i}].thumb"
        if stored is not None and not isinstance(stored, dict):
            raise TraceFormatError(f"{where}: expected a map, got {type(stored).__name__}")
        if stored is None or ("same" not in stored and "q8" not in stored):
            continue
        k = stored.get("same", i)
        held = rows.get(k) if type(k) is int and (k != i or "same" not in stored) else None
        if not isinstance(held, dict) or "q8" not in held:
            raise TraceFormatError(f"{where}: refers to tensor {k!r}, which holds no thumbnail")
        base[i] = k
    pictures: dict[int, np.ndarray] = {}
    groups: dict[tuple[int, int], list[int]] = {}
    for k in sorted(set(base.values())):
        groups.setdefault(_checked_shape(rows[k], f"tensors[{k}].thumb"), []).append(k)
    for shape, ks in groups.items():
        pictures.update(zip(ks, dequantise_same_shape([rows[k] for k in ks], shape)))
    out: dict[int, np.ndarray | None] = {}
    for i in idx:
        stored = rows.get(i)
        if i in base:
            a = pictures[base[i]]
            out[i] = np.ascontiguousarray(a.T) if "same" in stored and stored.get("T") else a
        else:
            out[i] = None if stored is None else decode_array(stored, f"tensors[{i}].thumb")  # a v2 row
    return out


def refers_to(stored: Any) -> int | None:
    """The index a kept thumbnail refers to, or None."""
    if isinstance(stored, dict) and "same" in stored and type(stored["same"]) is int:
        return int(stored["same"])
    return None
