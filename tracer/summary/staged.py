"""Statistics of device gradients, computed together: see NOTE [Staged statistics].

NOTE [Staged statistics]
    On a GPU every torch op is a kernel launch that costs the host 5-20 µs, however small the tensor,
    and `raw_stats` is about 25 of them. Measured on an H100 (torch 2.11, the Python recorder): 0.5-0.7 ms
    per gradient, 142 of the 254 ms of a traced GPT-6 step and most of the 0.7-0.9 ms per node of an
    LSTMCell loop. So a device gradient of up to `STAGE_MAX` elements is copied instead (one kernel,
    converted to float32, or kept as float64) into a staging buffer of its device, and the statistics of
    every tensor staged there are computed at once by segment reductions, about 25 kernels for the whole
    buffer, when it is full or at `Summariser.finalize`. Nothing waits for the device: the segment
    lengths go up through pinned memory without blocking, `segment_reduce` runs with `unsafe=True`
    (its check of the lengths would read them back), and the results stay on the device for finalize's
    one transfer. The numbers are `raw_stats`' eight, summed in float64. A bigger gradient keeps
    `raw_stats`: its reductions are real work, and staging it would double its memory.
"""

from __future__ import annotations

import math
from typing import Any

import torch

STAGE_MAX = 1 << 20  # elements: a larger gradient is summarised on its own (raw_stats)
STAGE_CAP = 1 << 22  # elements of one staging buffer (16 MB of float32); a full one is reduced, a new one begun
on_cpu = False  # stage CPU tensors too (the tests do, to check the reduction where there is no GPU)


class _Buffer:
    """One device's staging buffer of one dtype, and the summaries waiting on what was copied into it."""

    __slots__ = ("data", "used", "lengths", "waiting")

    def __init__(self, device: torch.device, dtype: torch.dtype, size: int) -> None:
        self.data = torch.empty(size, dtype=dtype, device=device)
        self.used = 0
        self.lengths: list[int] = []
        self.waiting: list[Any] = []  # PendingSummary, in the order of `lengths`


class StagedStats:
    """The staging buffers of one step's summaries, by (device, dtype)."""

    def __init__(self) -> None:
        self._open: dict[tuple[torch.device, torch.dtype], _Buffer] = {}

    def add(self, t: torch.Tensor, pending: Any) -> bool:
        """Copy `t` into its buffer; `pending.raw` is set when the buffer is reduced. False when `t` is
        not staged (not on a CUDA device, too big, empty, complex): the caller computes its statistics
        itself. Only CUDA is staged: it is where this was measured, and pinned memory is CUDA's."""
        n, dev = t.numel(), t.device
        if not 0 < n <= STAGE_MAX or t.is_complex() or (dev.type != "cuda" and not (on_cpu and dev.type == "cpu")):
            return False
        dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
        key = (dev, dtype)
        buf = self._open.get(key)
        if buf is not None and buf.used + n > buf.data.numel():
            self._reduce(buf)
            buf = None
        if buf is None:
            buf = self._open[key] = _Buffer(dev, dtype, STAGE_CAP)
        buf.data[buf.used:buf.used + n].view(t.shape).copy_(t.detach())
        buf.used += n
        buf.lengths.append(n)
        buf.waiting.append(pending)
        return True

    def reduce_all(self) -> None:
        """Reduce every buffer that has tensors waiting (at the end of the step)."""
        for buf in self._open.values():
            if buf.waiting:
                self._reduce(buf)
        self._open = {}

    @staticmethod
    def _reduce(buf: _Buffer) -> None:
        """Each waiting summary's [min, max, sum, sumsq, nonzero, nan, inf, finite] over its segment, as a row of
        one float64 tensor on the device (`raw_stats`' numbers)."""
        v = buf.data[:buf.used]
        lengths = torch.tensor(buf.lengths, dtype=torch.int64)
        if v.device.type != "cpu":
            lengths = lengths.pin_memory().to(v.device, non_blocking=True)
        fin = torch.isfinite(v)
        d = v.where(fin, 0.0).double()

        def seg(x: torch.Tensor, how: str) -> torch.Tensor:
            return torch.segment_reduce(x, how, lengths=lengths, unsafe=True)

        nan = seg(torch.isnan(v).double(), "sum")
        n_fin = seg(fin.double(), "sum")
        rows = torch.stack([seg(v.where(fin, math.inf), "min").double(), seg(v.where(fin, -math.inf), "max").double(),
                            seg(d, "sum"), seg(d * d, "sum"), seg(d.ne(0).double(), "sum"), nan,
                            lengths.double() - n_fin - nan, n_fin], dim=1)
        for p, row in zip(buf.waiting, rows):
            p.raw = row
        buf.waiting = []
        buf.lengths = []
