"""Thumbnails at bfloat16's precision (NOTE [Arena thumbnails] in tracer/summary/bfloat16.py): rounded as torch
rounds, by the native recorder's arena and by the Python summariser alike."""

from __future__ import annotations

import ctypes

import numpy as np
import torch

import gradscape
from gradscape.tracer.summary import bfloat16, kernel


def _edge_values() -> torch.Tensor:
    """Ties, the largest float32 (which rounds to infinity), subnormals, signed zeros, NaNs of either sign."""
    f = np.array([1.0, 1.00390625, 1.01171875, -1.00390625, 3.4028235e38, -3.4028235e38, 1e-40, -1e-45, 0.0, -0.0,
                  np.inf, -np.inf, 2.5e-3, 123456.0], np.float32)
    bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], np.uint32).view(np.float32)
    return torch.from_numpy(np.concatenate([f, bits, np.random.default_rng(0).standard_normal(90, np.float32)]))


def test_bfloat16_rounding_is_torchs() -> None:
    x = _edge_values()
    want = x.bfloat16().float().numpy()
    got = bfloat16.rounded(x.numpy())
    _same_bits(got, want)
    assert np.array_equal(bfloat16.widen(bfloat16.to_bfloat16(x.numpy())), got, equal_nan=True)


def test_every_kernel_build_rounds_as_numpy_does() -> None:
    """`gs_round_bf16` of each kernel build this CPU runs (the vectorised loops of the v3 and v4 builds, and a tail
    shorter than a register) gives `rounded_numpy`'s bits, every NaN as the one quiet NaN included; `rounded`
    uses the loaded build, and leaves its argument as it was."""
    x = _edge_values().numpy()
    want = bfloat16.rounded_numpy(x).view(np.uint32)
    assert (want[np.isnan(x)] == 0x7FC00000).all()
    paths = kernel.builds()
    assert paths, "the summary kernel was not built"
    for path in paths:
        fn = kernel._load(path).gs_round_bf16
        for n in (len(x), 1, 17):
            out = np.array(x[:n])
            fn(ctypes.c_void_p(out.ctypes.data), ctypes.c_int64(n))
            np.testing.assert_array_equal(out.view(np.uint32), want[:n], err_msg=path.name)
    assert kernel.round_bf16() is not None  # the loaded build has it: `rounded` is the kernel's
    before = x.copy()
    np.testing.assert_array_equal(bfloat16.rounded(x.reshape(12, 9)).view(np.uint32).ravel(), want)
    np.testing.assert_array_equal(x.view(np.uint32), before.view(np.uint32))


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit, signed zeros and infinities included; a NaN where torch has one (torch's own NaN bits differ
    between its scalar and vectorised conversions)."""
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan) and nan.sum() == 4
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def test_natively_recorded_thumbnails_are_torchs_bfloat16_of_the_gradient() -> None:
    """The native recorder's arena keeps a thumbnail's cells in bfloat16, rounded as torch rounds; the Python
    summariser's thumbnail of the same gradient is the same picture (a 108-element tensor is its own thumbnail)."""
    g = _edge_values().reshape(12, 9)
    x = torch.zeros(12, 9, requires_grad=True)
    traces = []
    for python in (False, True):
        with gradscape.Tracer(monitor=False, recorder="python" if python else "native").step(0) as st:
            (x * g).sum().backward()
        assert st.meta["recorder"] == ("python" if python else "native")
        leaf = next(n for n in st.nodes if n.kind == "leaf")
        traces.append(leaf.grad_outputs[0])
        x.grad = None
    want = g.bfloat16().float().numpy()
    for tr in traces:
        assert tr.thumb is not None and tr.thumb.dtype == np.float32
        _same_bits(tr.thumb, want)
        assert tr.stats["nan"] == 4 and tr.stats["inf"] == 2  # of the gradient, not of its picture
        assert tr.stats["max"] == float(np.float32(3.4028235e38))  # (its picture's rounds to infinity)
    np.testing.assert_array_equal(traces[0].thumb.view(np.uint32), traces[1].thumb.view(np.uint32))


def test_one_thumbnail_widens_as_a_stack_does() -> None:
    every = np.arange(1 << 16, dtype=np.uint16)  # every bit pattern, NaNs and infinities among them
    a, b = bfloat16.widen(every), bfloat16.widen_one(every.reshape(256, 256))
    assert a.dtype == b.dtype == np.float32 and b.shape == (256, 256)
    assert a.tobytes() == b.tobytes()
