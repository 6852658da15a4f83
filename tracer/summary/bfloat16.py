"""Thumbnails at bfloat16's precision: the native recorder's arena keeps each thumbnail's cells as bfloat16,
and the Python summariser rounds its CPU thumbnails the same way, so both recorders give the same picture.

NOTE [Arena thumbnails]
    A thumbnail is a picture of a gradient; its statistics are computed from the gradient itself, at full
    precision, and never from the picture. The kernel computes a thumbnail's block means in float32; what a
    step keeps is each mean rounded to bfloat16, to nearest, ties to even, as torch rounds: 8 significant
    bits and float32's exponent range (only a mean within 2^-9 of float32's largest value becomes an
    infinity, and only float32's smallest subnormals, below 2^-133, become zero). A NaN stays a NaN (the
    one quiet NaN 0x7FC0), an infinity an infinity. A cell is then off by at most 2^-8 of its own
    magnitude, where the trace file's 8-bit levels (NOTE [Compact thumbnails] in tracer/wire/compact.py)
    are off by up to 1/504 of the picture's range. On a graph of small ops the thumbnails are most of a
    step's memory: an `nn.LSTMCell` loop's (8, 32) gradient is its own thumbnail, and a 100k-node step's
    arena held 200 MiB of them in float32. A few summaries keep their rounded cells as float32 (`wide`,
    tracer/record/csrc/summaries.h): what each optimizer stepped with and thumbnails of at most 16 cells (a loss's
    gradient). The step's end makes those into `TensorTrace`s at once, and a view of float32 cells costs
    it less than a conversion would (the same values either way).
    A gradient on another device (CUDA) is summarised by the Python summariser with both recorders, and
    its thumbnail comes back in float32, not rounded: rounding it costs a numpy pass for each, and the
    step's memory on the host is the device step's thumbnails alone.
"""

from __future__ import annotations

import numpy as np

from gradscape.tracer.summary.kernel import round_bf16

_F32 = np.dtype(np.float32)
_QUIET_NAN = 0x7FC0  # every NaN cell becomes this one quiet NaN


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 `values` as bfloat16 bit patterns (uint16), rounded to nearest, ties to even."""
    b = np.ascontiguousarray(values, _F32).view(np.uint32)
    out = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        out[nan] = _QUIET_NAN
    return out


def widen(cells: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float32 values, exactly (for many: the stacks of a step's thumbnails)."""
    return (cells.astype(np.uint32) << np.uint32(16)).view(_F32)


# every bfloat16 bit pattern's float32 value (256 KiB): `widen_one` in one numpy call
_WIDE = widen(np.arange(1 << 16, dtype=np.uint16))


def widen_one(cells: np.ndarray) -> np.ndarray:
    """`widen` of one thumbnail, in one numpy call, a table lookup: the thumbnails made into `TensorTrace`s at a
    step's end are read one by one, and there each numpy call costs 2-3 µs (NOTE [Cold steps] in
    tracer/record/native.py; a root gradient's one-cell thumbnail had cost 6 µs widened by arithmetic)."""
    return _WIDE[cells]


def rounded(values: np.ndarray) -> np.ndarray:
    """float32 `values` rounded to bfloat16's precision, as float32 (a new array). With the summary kernel, a
    copy rounded in place by one call (3.4–3.7× faster than the eight numpy calls of `rounded_numpy`, which
    a step's end pays for each thumbnail the Python summariser made; the same bits)."""
    fn = round_bf16()
    if fn is None:
        return rounded_numpy(values)
    out = np.array(values, dtype=_F32, order="C")
    fn(out.__array_interface__["data"][0], out.size)
    return out


def rounded_numpy(values: np.ndarray) -> np.ndarray:
    """`rounded` in numpy."""
    return widen(to_bfloat16(values))
