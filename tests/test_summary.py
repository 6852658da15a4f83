"""Statistics and thumbnails, checked against numpy, with and without the C kernel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import CUDA

from gradscape.tracer.summary import kernel as _native
from gradscape.tracer.summary import staged
from gradscape.tracer.summary.fastpath import native_summary
from gradscape.tracer.summary.stats import raw_stats
from gradscape.tracer.summary.summariser import Summariser
from gradscape.tracer.summary.thumbnails import thumbnail
from gradscape.tracer.wire import thumbnail_view


def _reference(x: torch.Tensor) -> dict[str, float]:
    v = x.detach().double().reshape(-1).numpy()
    f = v[np.isfinite(v)]
    return {"min": f.min() if f.size else math.nan, "max": f.max() if f.size else math.nan,
            "mean": f.mean() if f.size else math.nan,
            "std": f.std(ddof=1) if f.size > 1 else (0.0 if f.size else math.nan),
            "norm": float(np.sqrt((f * f).sum())), "nan": float(np.isnan(v).sum()),
            "inf": float(np.isinf(v).sum()), "zeros": float((f == 0).sum())}


CASES = {
    "dense": lambda: torch.randn(300, 70),
    "relu_sparse": lambda: torch.relu(torch.randn(64, 6, 28, 28)),
    "big_1d": lambda: torch.randn(70_000),
    "scalar": lambda: torch.tensor(3.5),
    "with_nan_inf": lambda: torch.tensor([[1.0, float("nan"), -2.0], [float("inf"), 0.0, -float("inf")]]),
    "all_nan": lambda: torch.full((4, 4), float("nan")),
    "bf16": lambda: torch.randn(33, 130).bfloat16(),
    "float64": lambda: torch.randn(50, 3, dtype=torch.float64),
    "float64_wide": lambda: torch.randn(40, 70, dtype=torch.float64) * 1e60,  # past float32's range
    "float16": lambda: (torch.randn(33, 130) * 100).half(),
    "noncontiguous": lambda: torch.randn(90, 120).t(),
    "small_transposed": lambda: torch.randn(30, 20).t(),
    "large_values": lambda: torch.full((1000,), 3e20),
    "large_values_long": lambda: torch.randn((1 << 20) + 1) * 3e20,  # past STAGE_MAX: summarised on its own
}


@pytest.fixture(params=["native", "torch", "staged"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """native: the C kernel; torch: torch reductions; staged: the GPU's batched statistics (NOTE [Staged
    statistics]), run here on the CPU."""
    if request.param in ("torch", "staged"):
        monkeypatch.setattr("gradscape.tracer.summary.fastpath.native", lambda: None)
        monkeypatch.setattr(staged, "on_cpu", request.param == "staged")
    elif _native.native() is None:
        pytest.skip("the summary kernel was not built at install (no C compiler then)")
    return str(request.param)


@pytest.mark.parametrize("case", sorted(CASES))
def test_stats_match_numpy(case: str, backend: str) -> None:
    _check_summary(case, "cpu")


@pytest.mark.parametrize("device", [CUDA])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_stats_match_numpy(case: str, device: str) -> None:
    """A CUDA gradient of every float type is summarised on the device, fetched at `finalize`."""
    _check_summary(case, device)


def _check_summary(case: str, device: str) -> None:
    torch.manual_seed(0)
    x = CASES[case]()
    on = x.to(device)
    s = Summariser(thumb=64)
    tr = s.summarise(on)
    s.finalize()
    assert tr.device == str(on.device)
    ref = _reference(x)
    for k, want in ref.items():
        got = tr.stats[k]
        if math.isnan(want):
            assert math.isnan(got), k
        else:
            assert got == pytest.approx(want, rel=2e-4, abs=1e-6), (k, got, want)
    assert tr.thumb is not None and tr.thumb.dtype == np.float32
    assert tr.thumb.shape[0] <= 64 and tr.thumb.shape[1] <= 64


def test_nan_and_inf_are_counted_never_dropped(backend: str) -> None:
    x = torch.zeros(10, 10)
    x[3, 4] = float("nan")
    x[7, 1] = float("inf")
    x[0, 0] = -float("inf")
    x[5, 5] = 2.0
    s = Summariser(thumb=4)
    tr = s.summarise(x)
    s.finalize()
    assert (tr.stats["nan"], tr.stats["inf"]) == (1, 2)
    assert (tr.stats["min"], tr.stats["max"]) == (0.0, 2.0)  # over the finite elements
    assert tr.stats["zeros"] == 96
    # each shows in its own 3×3 block of the 4×4 picture (the mean of a block with one of them in it)
    assert np.argwhere(np.isnan(tr.thumb)).tolist() == [[1, 1]]
    assert np.argwhere(np.isinf(tr.thumb)).tolist() == [[0, 0], [2, 0]]
    assert tr.thumb[0, 0] == -np.inf and tr.thumb[2, 0] == np.inf
    assert np.count_nonzero(tr.thumb) == 3  # every other block holds only zeros


@pytest.mark.parametrize("shape, view, thumb_shape", [
    ((), "scalar", (1, 1)),
    ((5,), "strip 1×5", (1, 5)),
    ((64, 84), "rows 64 × cols 84", (64, 42)),
    ((8, 128, 384), "rows 8·128 (dim0·dim1) × cols 384", (64, 64)),
    ((64, 16, 10, 10), "sample 0 of 64: 16 channels as tiles of 10×10", (40, 40)),
    ((2, 3, 5, 5), "sample 0 of 2: 3 channels as tiles of 5×5", (10, 10)),
])
def test_thumbnail_views(shape: tuple[int, ...], view: str, thumb_shape: tuple[int, int]) -> None:
    assert thumbnail_view(shape) == view
    x = torch.randn(shape)
    th = thumbnail(x, 64)
    assert tuple(th.shape) == thumb_shape
    if len(shape) == 4:  # channel c of sample 0 is tile (c // grid, c % grid)
        grid = math.ceil(math.sqrt(shape[1]))
        h, w = th.shape[0] // math.ceil(shape[1] / grid), th.shape[1] // grid
        c = shape[1] - 1
        r0, c0 = (c // grid) * h, (c % grid) * w
        if (h, w) == shape[2:]:
            assert torch.equal(th[r0:r0 + h, c0:c0 + w], x[0, c])
        if shape[1] < grid * grid:
            assert torch.isnan(th[-1, -1])  # an empty grid cell


def test_block_mean_is_exact() -> None:
    x = torch.arange(130 * 3, dtype=torch.float32).reshape(130, 3)
    th = thumbnail(x, 64)  # rows in blocks of 3 (the last block: 1 row)
    assert tuple(th.shape) == (44, 3)
    assert torch.allclose(th[0], x[:3].mean(0)) and torch.allclose(th[-1], x[129])
    fast = native_summary(x, 64)
    if fast is not None:
        assert fast[1] is not None and np.allclose(fast[1], th.numpy())


def test_thumbnail_never_aliases_the_gradient() -> None:
    g = torch.randn(4, 4)
    before = g.clone()
    s = Summariser(thumb=64, keep_values=True)
    tr = s.summarise(g)
    g.mul_(0)  # autograd may reuse or accumulate into gradient memory after the hook
    s.finalize()
    # what was summarised is the gradient as it was (a 4×4 tensor is its own thumbnail, at bfloat16's
    # precision: NOTE [Arena thumbnails]), not the zeros
    np.testing.assert_array_equal(tr.values, before.numpy())
    np.testing.assert_array_equal(tr.thumb, before.bfloat16().float().numpy())
    assert tr.stats["max"] == float(before.max())  # the statistics are the gradient's own, at full precision


# ---- the C kernel against the torch reference (`thumbnail`, `raw_stats`), shape by shape ----

KERNEL_SHAPES = [
    (), (1,), (5,), (64,), (65,), (200,), (4097,), (70_000,),  # 1-D: a strip; past size; past GS_CHUNK
    (1, 1), (3, 5), (64, 10), (10, 64), (64, 64), (65, 65), (127, 129), (64, 400), (400, 120), (130, 3),
    (3, 130), (5000, 3), (9000, 1), (1, 9000), (100, 4100), (2, 8192),  # 2-D: below/at/above size, uneven
    (2, 3, 4), (8, 16, 70), (4, 50, 130),  # 3-D
    (2, 1, 5, 5), (2, 1, 100, 90), (3, 3, 5, 5), (2, 3, 40, 70), (1, 6, 28, 28), (3, 6, 28, 28),
    (2, 16, 5, 5), (2, 16, 10, 10), (2, 16, 30, 17), (2, 17, 8, 8), (2, 17, 20, 3), (1, 6, 1, 1),
    (2, 100, 3, 3), (1, 3, 200, 2),  # 4-D: C = 1, 3, 6, 16, 17, 100; H, W below and above the tile
    (2, 3, 4, 5, 6), (2, 2, 2, 40, 70),  # 5-D
]


@pytest.fixture
def kernel() -> None:
    if _native.native() is None:
        pytest.skip("the summary kernel was not built at install (no C compiler then)")


def _data(shape: tuple[int, ...], dtype: torch.dtype, contiguous: bool, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    flat = torch.randn(max(n, 1) * 2, generator=g) * 3 + 0.5
    flat[flat.abs() < 0.4] = 0.0  # zeros, for the non-zero count
    if contiguous or len(shape) == 0:
        x = flat[:n].reshape(shape)
    elif len(shape) == 1:
        x = flat[: 2 * n : 2]  # every other element
    else:  # the same values, laid out transposed
        x = flat[:n].reshape(shape[::-1]).permute(*reversed(range(len(shape))))
        assert not x.is_contiguous() or 1 in shape
    return x.to(dtype)


def _check_stats(got: tuple[float, ...], x: torch.Tensor) -> None:
    want = [float(v) for v in raw_stats(x)]
    assert len(got) == 8 and all(isinstance(v, float) for v in got)
    mn, mx, s, ss, nz, nan, inf, fin = got
    if want[7] == 0:  # nothing finite: the kernel says NaN, torch ±inf; `stats_from_raw` shows NaN for both
        assert math.isnan(mn) and math.isnan(mx)
    else:
        assert (mn, mx) == (want[0], want[1]), (got, want)  # the extremes are exact
    scale = math.sqrt(max(fin, 1.0) * max(want[3], 0.0))  # bounds Σ|x|: float sums err relative to it
    assert abs(s - want[2]) <= 1e-5 * scale + 1e-6, (s, want[2])
    # against the exact sum of squares: torch's own float32 sum of 410k squares is off by 1.8e-5 on one thread
    assert ss == pytest.approx(want[3] if x.dtype == torch.float64 else _exact_ss(x), rel=1e-5, abs=1e-6)
    assert (nz, nan, inf, fin) == tuple(want[4:]), (got, want)


def _exact_ss(x: torch.Tensor) -> float:
    """Σx² over the finite elements, in float64 (exact enough for any float32 or narrower input)."""
    xd = x.detach().double().reshape(-1)
    return float(xd[torch.isfinite(xd)].pow(2).sum())


def _check_thumb(got: np.ndarray | None, x: torch.Tensor, size: int) -> None:
    want = thumbnail(x, size).numpy()
    assert got is not None and got.dtype == np.float32 and got.flags.c_contiguous
    assert got.shape == want.shape, (got.shape, want.shape)
    tol = {"rtol": 1e-5, "atol": 1e-6} if x.dtype == torch.float32 else {"rtol": 1e-4, "atol": 1e-5}
    np.testing.assert_allclose(got, want, equal_nan=True, **tol)  # NaN and ±Inf in the same cells too


KERNEL_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
KERNEL_DTYPE_IDS = ["f32", "bf16", "f16", "f64"]


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=KERNEL_DTYPE_IDS)
@pytest.mark.parametrize("size", [64, 8])
@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=str)
def test_kernel_matches_torch(shape: tuple[int, ...], size: int, dtype: torch.dtype, contiguous: bool,
                              kernel: None) -> None:
    x = _data(shape, dtype, contiguous)
    got = native_summary(x, size)
    assert got is not None
    _check_stats(got[0], x)
    _check_thumb(got[1], x, size)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=KERNEL_DTYPE_IDS)
@pytest.mark.parametrize("size", [64, 8])
@pytest.mark.parametrize("shape", [(7,), (10_000,), (40, 30), (300, 500), (3, 70, 90), (2, 6, 28, 28),
                                   (2, 17, 9, 9), (3, 2, 4, 100, 5)], ids=str)
def test_kernel_nan_inf(shape: tuple[int, ...], size: int, dtype: torch.dtype, kernel: None) -> None:
    x = _data(shape, torch.float32, True)
    flat = x.view(-1)
    n = flat.numel()
    g = torch.Generator().manual_seed(1)
    idx = torch.randperm(n, generator=g)[:6]
    flat[idx[:2]] = float("nan")
    flat[idx[2:4]] = float("inf")
    flat[idx[4]] = -float("inf")
    if n > 8:  # +Inf and -Inf in one block make NaN, as in torch
        flat[0], flat[1] = float("inf"), -float("inf")
    x = x.to(dtype)
    got = native_summary(x, size)
    assert got is not None
    _check_stats(got[0], x)
    assert got[0][5] == torch.isnan(x).sum().item() and got[0][6] == torch.isinf(x).sum().item()
    _check_thumb(got[1], x, size)
    sample0 = x[0] if x.dim() == 4 else x
    if not torch.isfinite(sample0).all():
        assert not np.isfinite(got[1]).all()  # the picture shows them


def test_kernel_all_non_finite_and_chunks(kernel: None) -> None:
    x = torch.full((3, 5), float("nan"))
    x[1, 2] = float("inf")
    got = native_summary(x, 64)
    assert got is not None
    _check_stats(got[0], x)
    _check_thumb(got[1], x, 64)
    y = torch.randn(3 * 4096 + 17)
    y[4096 + 5] = float("nan")  # one chunk of several needs the masked pass; the others do not
    y[2 * 4096 - 1] = -float("inf")
    y[100] = 1e3  # the extremes sit in chunks without NaN
    y[3 * 4096 + 3] = -1e3
    got = native_summary(y, 64)
    assert got is not None
    _check_stats(got[0], y)
    assert got[0][:2] == (-1e3, 1e3)
    _check_thumb(got[1], y, 64)


def test_kernel_widens_every_float16(kernel: None) -> None:
    """Every one of float16's 65,536 bit patterns (subnormals, ±0, ±Inf, NaNs) widened exactly: the
    kernel's statistics and thumbnail are those torch computes from `x.float()`."""
    x = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16).reshape(256, 256)
    got = native_summary(x, 256)  # 256×256: the thumbnail is every value
    assert got is not None and got[1] is not None
    _check_stats(got[0], x)
    np.testing.assert_array_equal(got[1], x.float().numpy())
    assert got[0][5] == torch.isnan(x).sum().item() == 2046 and got[0][6] == 2


def test_kernel_float64_is_summarised_in_double(kernel: None) -> None:
    """float64 statistics are exact doubles (beyond float32's range and precision); the thumbnail is
    the torch path's, from the values rounded to float32; sums past float64 step aside for torch."""
    x = torch.tensor([1e150, -1e-300, 1.0 + 2.0 ** -40, 0.0, float("nan"), -3e140], dtype=torch.float64)
    got = native_summary(x, 64)
    assert got is not None and got[1] is not None
    assert got[0][:2] == (-3e140, 1e150)
    y = torch.tensor([1.0 + 2.0 ** -40, -2.0 ** -1074, 0.0], dtype=torch.float64)
    res = native_summary(y, 64)
    assert res is not None and res[0][:2] == (-(2.0 ** -1074), 1.0 + 2.0 ** -40) and res[0][4] == 2.0
    _check_thumb(got[1], x, 64)
    assert native_summary(torch.full((10,), 1e200, dtype=torch.float64), 64) is None  # Σx² overflows double


def test_kernel_overflow_and_no_thumbnail(kernel: None) -> None:
    assert native_summary(torch.full((1000,), 3e20), 64) is None  # float32 sums overflow: torch recomputes
    x = torch.randn(2, 3, 4, 5)
    got = native_summary(x, 0)
    assert got is not None and got[1] is None
    _check_stats(got[0], x)
    a, b = native_summary(x, 8), native_summary(x, 8)
    assert a is not None and b is not None and a[1] is not None and b[1] is not None
    assert np.isfinite(b[1]).any() and np.any(b[1][np.isfinite(b[1])] != 0)
    kept = b[1].copy()
    a[1][:] = 0  # each call returns its own picture: writing into one leaves the other as it was
    np.testing.assert_array_equal(b[1], kept)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fast_path_gives_the_trace_the_first_call_gave(case: str, kernel: None) -> None:
    """The first summary of a shape makes its kernel plan; later ones take `summarise_no_grad`'s
    fast path (CPU float32/bf16, contiguous or a transposed matrix). Both must give the same trace,
    and the fast path must really be taken where it applies (and step aside for an overflow, which
    torch recomputes)."""
    torch.manual_seed(0)
    x = CASES[case]()
    s = Summariser(thumb=64)
    first = s.summarise(x)
    fast_before = len(s._buffers)
    second = s.summarise(x)
    fast = len(s._buffers) - fast_before
    s.finalize()
    transposed = x.dim() == 2 and x.t().is_contiguous()  # native_summary's detour through x.T
    eligible = (x.is_contiguous() or transposed) and x.dtype in KERNEL_DTYPES \
        and case not in ("large_values", "large_values_long")  # float32 partial sums overflow
    assert fast == (1 if eligible else 0)
    for f in ("shape", "dtype", "device", "thumb_view"):
        assert getattr(second, f) == getattr(first, f), f
    assert type(second.shape) is tuple and second.stats.keys() == first.stats.keys()
    for k, v in first.stats.items():
        assert (math.isnan(v) and math.isnan(second.stats[k])) or second.stats[k] == v, k
    assert first.thumb is not None and second.thumb is not None
    np.testing.assert_array_equal(second.thumb, first.thumb)
    ref = _reference(x)  # and both are right
    assert second.stats["zeros"] == ref["zeros"] and second.stats["nan"] == ref["nan"]


@pytest.mark.parametrize("case", ["transpose", "clone", "other_memory"])
def test_a_view_of_the_same_memory_shares_the_kernel_buffer(case: str, kernel: None) -> None:
    """NOTE [Views share a buffer]: a view node's output at the address of what arrived, read by the
    same kernel call, reuses that call's buffer (no second kernel call), and its trace is still the
    one a fresh summary gives; the same elements elsewhere in memory are summarised anew."""
    torch.manual_seed(0)
    arrived = torch.randn(120, 400).t()  # what a TBackward0 receives: the transpose of a contiguous matrix
    sent = {"transpose": arrived.t(), "clone": arrived, "other_memory": arrived.t().clone()}[case]
    s = Summariser(thumb=64)
    s.summarise(arrived), s.summarise(sent)  # the first summaries of these shapes make the plans
    s.finalize()
    go = s.summarise(arrived)
    calls = len(s._fast)
    gi = s.summarise(sent, go)
    assert len(s._fast) == calls + (case == "other_memory")
    shared = s._buffers[-1][1] is s._buffers[-2][1] and s._buffers[-1][2] == s._buffers[-2][2]  # chunk, offset
    assert shared == (case != "other_memory")
    s.finalize()
    fresh = Summariser(thumb=64)
    want = fresh.summarise(sent.clone())
    fresh.finalize()
    assert gi.shape == want.shape and gi.thumb_view == want.thumb_view and gi.stats == want.stats
    assert gi.thumb is not None and want.thumb is not None and gi.thumb.shape == want.thumb.shape
    np.testing.assert_allclose(gi.thumb, want.thumb, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(go.thumb, gi.thumb.T if case != "clone" else gi.thumb)


def test_finalize_counts_thumbnail_cells_and_nonfinite():
    """`thumb_cells` bounds what the thumbnail budget would count (it skips its walk within the budget);
    `nonfinite` says whether any summary held a NaN or an Inf (the problem finder skips its scan otherwise)."""
    s = Summariser(8)
    traces = [s.summarise(torch.randn(8, 32)) for _ in range(3)] + [s.summarise(torch.randn(5))]
    traces.append(s.summarise(torch.randn(32, 8).t()))  # a transposed matrix
    s.finalize()
    assert s.thumb_cells == sum(t.thumb.size for t in traces if t.thumb is not None) > 0
    assert not s.nonfinite
    bad = torch.randn(8, 32)
    bad[0, 0] = math.inf
    assert s.summarise(bad).stats == {}
    s.finalize()
    assert s.nonfinite
