"""Sparse gradients, summarised without making them dense.

NOTE [Sparse gradients]
    A sparse gradient (COO, e.g. from `nn.Embedding(sparse=True)`, or CSR/CSC/BSR/BSC) is never made
    dense: it is coalesced (each stored element once) and its statistics are those of the whole tensor,
    computed from the stored values with the unstored elements counted as zeros. Its thumbnail is the
    same block-mean picture a dense gradient gets (but for 4-D: its rows are the leading dimensions
    flattened), summed cell by cell from the stored elements.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradscape.tracer import _compat
from gradscape.tracer.wire import matrix_shape, thumbnail_view


def as_coalesced_coo(t: torch.Tensor) -> torch.Tensor | None:
    """`t` (sparse COO, CSR, CSC, BSR or BSC) as a coalesced COO tensor, never dense: each stored
    element once, duplicates summed. None for a layout without stored values to read."""
    try:
        coo = t.detach() if t.layout == torch.sparse_coo else t.detach().to_sparse_coo()
        return coo if coo.is_coalesced() else coo.coalesce()
    except (RuntimeError, NotImplementedError):
        return None


def with_implicit_zeros(raw: Any, zeros: int) -> Any:
    """`raw_stats` of a sparse tensor's stored values, made the statistics of the whole tensor by
    adding its `zeros` unstored elements: they count as finite zeros, and bound min and max by 0."""
    if zeros <= 0:
        return raw
    if isinstance(raw, tuple):
        mn, mx, s, ss, nz, nan, inf, n = raw
        mn = 0.0 if math.isnan(mn) else min(mn, 0.0)
        mx = 0.0 if math.isnan(mx) else max(mx, 0.0)
        return (mn, mx, s, ss, nz, nan, inf, n + zeros)
    zero = raw.new_zeros(())
    return torch.stack([torch.fmin(raw[0], zero), torch.fmax(raw[1], zero), raw[2], raw[3], raw[4], raw[5],
                        raw[6], raw[7] + zeros])


def sparse_thumbnail(coo: torch.Tensor, size: int) -> tuple[torch.Tensor, str]:
    """The block-mean thumbnail of a coalesced sparse COO tensor, computed from its stored elements
    alone (no dense copy): each stored value is added to the cell of its block, and each cell divided
    by its block's size. For every rank but 4 it equals `thumbnail` of the dense tensor; a 4-D
    tensor is shown as rank 5+ would be (rows: the leading dimensions flattened)."""
    shape = tuple(coo.shape)
    view = thumbnail_view(shape) if len(shape) != 4 else f"rows {'·'.join(map(str, shape[:-1]))} × cols {shape[-1]}"
    rows, cols = matrix_shape(shape)
    dev = coo.device
    if rows == 0 or cols == 0:
        return torch.zeros((0, 0), device=dev), view
    kr, kc = max(1, -(-rows // size)), max(1, -(-cols // size))
    nr, nc = -(-rows // kr), -(-cols // kc)
    sd = coo.sparse_dim()
    idx, vals = _compat.sparse_indices(coo), _compat.sparse_values(coo)
    if vals.is_complex():
        vals = vals.abs()
    dense_n = math.prod(shape[sd:])
    strides = [math.prod(shape[i + 1:sd]) for i in range(sd)]
    lin = (idx * torch.tensor(strides, dtype=idx.dtype, device=dev)[:, None]).sum(0)  # over the sparse dims
    flat = (lin[:, None] * dense_n + torch.arange(dense_n, device=dev)).reshape(-1)  # index in the whole tensor
    r, c = flat // cols, flat % cols
    sums = torch.zeros(nr * nc, dtype=torch.float32, device=dev)
    sums.index_add_(0, (r // kr) * nc + c // kc, vals.reshape(-1).float())
    per_row = (rows - torch.arange(nr, device=dev) * kr).clamp(max=kr)
    per_col = (cols - torch.arange(nc, device=dev) * kc).clamp(max=kc)
    return sums.view(nr, nc) / (per_row[:, None] * per_col[None, :]).float(), view

