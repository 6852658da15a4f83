"""Statistics and thumbnails, checked against numpy, with and without the C kernel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tracer import _native
from tracer._summary import Summariser, native_summary, thumbnail, thumbnail_view


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
    "noncontiguous": lambda: torch.randn(90, 120).t(),
    "large_values": lambda: torch.full((1000,), 3e20),
}


@pytest.fixture(params=["native", "torch"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "torch":
        monkeypatch.setattr("tracer._summary.native", lambda: None)
    elif _native.native() is None:
        pytest.skip("no C compiler here: the kernel cannot be built")
    return str(request.param)


@pytest.mark.parametrize("case", sorted(CASES))
def test_stats_match_numpy(case: str, backend: str) -> None:
    torch.manual_seed(0)
    x = CASES[case]()
    s = Summariser(thumb=64)
    tr = s.summarise(x)
    s.finalize()
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
    assert np.isnan(tr.thumb).sum() >= 1  # the NaN shows in its block of the picture


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
    s = Summariser(thumb=64, keep_values=True)
    tr = s.summarise(g)
    g.mul_(0)  # autograd may reuse or accumulate into gradient memory after the hook
    s.finalize()
    assert np.abs(tr.thumb).sum() > 0 and np.abs(tr.values).sum() > 0
