"""The install-time summary kernel: what gradscape does without it (a warning once, summaries by torch), and
every instruction-set build it makes against the known values, all-finite tensors, float16 widening and the
geometry checks made before any call."""

from __future__ import annotations

import ctypes
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import gradscape
from gradscape.tracer.record import native as _recorder
from gradscape.tracer.summary import fastpath as _summary
from gradscape.tracer.summary import kernel as _native


def _kernel_as_installed() -> None:
    """Forget what a test with the kernel missing or turned off made the loaders conclude: the kernel's, and the
    native recorder's, which needs the kernel (else every later test in the process runs without it)."""
    _native._loaded.cache_clear()
    _native._warn_once.cache_clear()
    _recorder._loaded.cache_clear()


def test_missing_kernel_warns_once_and_summaries_use_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_native, "_HERE", tmp_path)  # an install whose kernel was not built
    _native._loaded.cache_clear()
    _native._warn_once.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="summary kernel was not built when gradscape was installed"):
            assert _native.native() is None
        assert _native.native() is None  # once: a second call says nothing (warnings are errors here)
        assert _native.summariser().startswith("torch (the summary kernel was not built")
        g = torch.tensor([[1.0, -2.0], [3.0, 0.0]])
        assert _summary.native_summary(g, 8) is None
        st = gradscape.trace((torch.nn.Parameter(g) * 2).sum())
        assert st.nodes
    finally:
        monkeypatch.undo()
        _kernel_as_installed()
    assert _native.summariser() == "native"


def test_native_off_by_environment_says_so_without_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADSCAPE_NATIVE", "0")
    _native._loaded.cache_clear()
    try:
        assert _native.native() is None
        assert _native.summariser() == "torch (GRADSCAPE_NATIVE=0)"
    finally:
        monkeypatch.undo()
        _kernel_as_installed()


def _kernel_run(lib: ctypes.CDLL, x: torch.Tensor, size: int) -> tuple[list[float], list[float]]:
    geometry, th = _summary._native_geometry(tuple(x.shape), size)
    k = th[0] * th[1] if th else 0
    geom = (ctypes.c_int64 * 7)(x.numel(), *geometry)
    buf = (ctypes.c_double * (8 + (k + 1) // 2))()
    fn = {torch.float32: lib.gs_summarise_f32, torch.bfloat16: lib.gs_summarise_bf16,
          torch.float16: lib.gs_summarise_f16}[x.dtype]
    assert fn(x.data_ptr(), geom, buf) == 0
    thumb = (ctypes.c_float * k).from_buffer(buf, 64)
    return list(buf[:8]), list(thumb)


def _builds() -> list[Path]:
    builds = _native.builds()
    assert builds, "the summary kernel was not built"
    return builds


def test_every_instruction_set_build_gives_the_known_values() -> None:
    """Each build of the kernel that this machine runs (baseline, x86-64-v3, v4) against values
    computed in float64 by torch."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 53, generator=g)
    x[3, 5], x[10, 1], x[20, 20] = math.nan, math.inf, 0.0
    for path in _builds():
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            stats, thumb = _kernel_run(_native._load(path), xd, 8)
            fd = xd.double()[torch.isfinite(xd.double())]
            want = [fd.min().item(), fd.max().item(), fd.sum().item(), (fd * fd).sum().item(),
                    float((fd != 0).sum()), 1.0, 1.0, float(fd.numel())]
            assert stats[:2] == want[:2] and stats[4:] == want[4:], path.name
            assert stats[2:4] == pytest.approx(want[2:4], rel=1e-5), path.name
            # block means of 5×7 blocks (ceil(37/8), ceil(53/8)); a block holding NaN or Inf shows it
            blocks = xd.double()
            rows = [blocks[i:i + 5] for i in range(0, 37, 5)]
            means = [r[:, j:j + 7].mean().item() for r in rows for j in range(0, 53, 7)]
            assert thumb == pytest.approx(means, rel=1e-5, nan_ok=True), path.name


@pytest.mark.parametrize(("shape", "pick", "count"), [((64, 128), lambda x: x[:, 0::2] + x[:, 1::2], 2),
                                                      ((128, 64), lambda x: x[0::2] + x[1::2], 2)],
                         ids=["1x2", "2x1"])
def test_block_means_are_the_float_quotients_bit_for_bit(shape: tuple[int, int], pick: Any, count: int) -> None:
    """A block of a power-of-two count is divided by multiplying with its exact reciprocal (_fastsum_thumb.h): each
    cell is still the float32 sum divided by the count in float32, bit for bit, subnormal cells included. A block
    of two elements has one float32 sum, whatever the order, so the cells are known here."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(*shape, generator=g) * torch.logspace(-40, 15, shape[1])  # subnormal to large cells
    want = (pick(x).numpy() / np.float32(count)).astype(np.float32).reshape(-1)
    for path in _builds():
        _stats, thumb = _kernel_run(_native._load(path), x, 64)
        got = np.array(thumb, np.float32)
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), path.name


@pytest.mark.parametrize("n", [1, 63, 64, 4096 + 1000, 3 * 4096])
def test_every_build_summarises_an_all_finite_tensor(n: int) -> None:
    """The all-finite chunk, which the v3 and v4 builds write with intrinsics (eight and sixteen lanes,
    then a scalar tail): lengths below one vector step, one exact step, a chunk and a tail, whole chunks.
    Zeros of both signs and subnormals are counted as torch counts them; the extremes are exact."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, generator=g) * 3
    x[::7] = 0.0
    x[3::11] = -0.0
    x[5::13] = 1e-40  # subnormal in float32
    x[n // 2] = -123.5
    fd = x.double()
    want = [fd.min().item(), fd.max().item(), fd.sum().item(), (fd * fd).sum().item(), float((fd != 0).sum()),
            0.0, 0.0, float(n)]
    for path in _builds():
        stats, _ = _kernel_run(_native._load(path), x.reshape(1, n), 8)
        assert stats[:2] == want[:2] and stats[4:] == want[4:], path.name
        assert abs(stats[2] - want[2]) <= 1e-6 * fd.abs().sum().item(), path.name  # float sums: vs Σ|x|
        assert stats[3] == pytest.approx(want[3], rel=1e-5), path.name


def test_every_build_widens_every_float16_exactly() -> None:
    """Each build (the v3 and v4 ones convert with the CPU's F16C instructions eight at a time, the
    baseline with integer arithmetic) widens all 65,536 float16 bit patterns exactly, subnormals
    included, and a tail that is not a multiple of eight: a thumbnail of one cell per value is
    `x.float()` itself, and the statistics are torch's in float64."""
    patterns = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    g = torch.Generator().manual_seed(5)
    tail = (torch.randn(251 * 263 - patterns.numel(), generator=g) * 1e-6).half()  # mostly subnormal
    x = torch.cat([patterns, tail]).reshape(251, 263)
    fin = x.double()[torch.isfinite(x.double())]
    for path in _builds():
        stats, thumb = _kernel_run(_native._load(path), x, 263)
        assert thumb == pytest.approx(x.float().flatten().tolist(), abs=0, rel=0, nan_ok=True), path.name
        assert stats[:2] == [fin.min().item(), fin.max().item()], path.name
        assert stats[4:] == [float((fin != 0).sum()), float(torch.isnan(x).sum()), 2.0, float(fin.numel())], path.name
        assert abs(stats[2] - fin.sum().item()) <= 1e-6 * fin.abs().sum().item(), path.name  # float sums: vs Σ|x|
        assert stats[3] == pytest.approx((fin * fin).sum().item(), rel=1e-5), path.name


@pytest.mark.parametrize(("n", "geometry", "thumb", "nbytes", "message"), [
    (100, [1, 10, 10, 2, 2], (5, 5), 164, "6 numbers"),
    (100, [1, 10, 11, 2, 2, 1], (5, 6), 184, "read past a tensor of 100 elements"),
    (100, [1, 10, 10, 0, 2, 1], (5, 5), 164, "must be positive"),
    (100, [1, 10, 10, 2, 2, 1], (4, 5), 164, "makes a 5×5 thumbnail, expected (4, 5)"),
    (100, [1, 10, 10, 2, 2, 1], (5, 5), 160, "buffer of 160 bytes, the kernel writes 164"),
    (100, [-1, 10, 10, 2, 2, 1], None, 64, "negative plane count"),
])
def test_kernel_geometry_is_checked_before_any_call(n: int, geometry: list[int], thumb: tuple[int, int] | None,
                                                    nbytes: int, message: str) -> None:
    with pytest.raises(_native.KernelGeometryError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _native.check_geometry(n, geometry, thumb, nbytes)


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 200), (130, 70), (2, 3, 4, 5), (2, 17, 9, 33)])
def test_every_plan_the_summariser_makes_passes_the_check(shape: tuple[int, ...]) -> None:
    """Every shape the summariser plans for (empty tensors never reach the kernel) passes the check."""
    for size in (0, 1, 8, 64):
        geometry, th = _summary._native_geometry(shape, size)
        k = th[0] * th[1] if th else 0
        _native.check_geometry(math.prod(shape), geometry, th, 8 * (8 + (k + 1) // 2))


def _strided_run(lib: ctypes.CDLL, x: torch.Tensor, size: int) -> tuple[int, list[float]]:
    """`gs_summarise_strided` on `x` where it lies: (status, its output words)."""
    geometry, th = _summary._native_geometry(tuple(x.shape), size)
    k = th[0] * th[1] if th else 0
    geom = (ctypes.c_int64 * 7)(x.numel(), *geometry)
    code = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[x.dtype]
    lay = (ctypes.c_int64 * (2 + 2 * x.dim()))(code, x.dim(), *x.shape, *x.stride())
    buf = (ctypes.c_double * (8 + (k + 1) // 2))()
    status = lib.gs_summarise_strided(ctypes.c_void_p(x.data_ptr()), geom, lay, buf)
    return status, list(buf)


def _layouts(g: torch.Generator) -> list[torch.Tensor]:
    """Strided views of random tensors: permutations (1 to 6 dimensions), steps, expansions, an offset start."""
    out = []
    for _ in range(40):
        nd = int(torch.randint(1, 7, (), generator=g))
        shape = [int(torch.randint(1, 9, (), generator=g)) for _ in range(nd)]
        base = torch.randn([s * 2 for s in shape], generator=g)
        base[tuple(torch.randint(0, s, (), generator=g) for s in base.shape)] = math.nan
        view = base[tuple(slice(1, None, 2) for _ in shape)]  # every other element, from an offset
        out.append(view.permute(*torch.randperm(nd, generator=g).tolist()))
    big = torch.randn(40, 30, 9, generator=g)
    out += [big.permute(2, 0, 1), torch.randn(7, 1, 5, generator=g).expand(7, 300, 5),
            torch.randn(50, generator=g)[::3]]
    return out


def test_every_build_summarises_a_strided_tensor_as_its_contiguous_copy() -> None:
    """`gs_summarise_strided` (NOTE [Strided gradients] in tracer/record/csrc/summaries.h) reads a strided tensor
    where it lies; its statistics and thumbnail are, bit for bit, those the dtype's kernel gives its contiguous
    copy: permutations, steps, an offset start, an expansion, a NaN, over a kernel chunk, in each float dtype."""
    g = torch.Generator().manual_seed(5)
    for path in _builds():
        lib = _native._load(path)
        lib.gs_summarise_strided.restype = ctypes.c_int
        for x in _layouts(g):
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                xd = x.to(dtype) if dtype != torch.float32 else x
                if xd.is_contiguous():
                    xd = xd.expand(2, *xd.shape)  # an expanded copy of it: strided again
                status, got = _strided_run(lib, xd, 8)
                c = xd.contiguous()
                geometry, th = _summary._native_geometry(tuple(c.shape), 8)
                k = th[0] * th[1] if th else 0
                want = (ctypes.c_double * (8 + (k + 1) // 2))()
                fn = {torch.float32: lib.gs_summarise_f32, torch.bfloat16: lib.gs_summarise_bf16,
                      torch.float16: lib.gs_summarise_f16}[dtype]
                assert fn(c.data_ptr(), (ctypes.c_int64 * 7)(c.numel(), *geometry), want) == status == 0
                assert struct.pack(f"{len(got)}d", *got) == struct.pack(f"{len(got)}d", *want), (path.name, x.shape)


def test_the_strided_kernel_refuses_a_layout_it_does_not_take() -> None:
    lib = _native._load(_builds()[0])
    x = torch.randn(3, 4).t()
    geometry, _ = _summary._native_geometry((4, 3), 0)
    geom = (ctypes.c_int64 * 7)(12, *geometry)
    buf = (ctypes.c_double * 8)()
    for code, nd in ((3, 2), (0, 0), (0, 9)):  # float64; no dimension; more than it takes
        lay = (ctypes.c_int64 * 20)(code, nd, 4, 3, 1, 4)
        assert lib.gs_summarise_strided(ctypes.c_void_p(x.data_ptr()), geom, lay, buf) == 3
