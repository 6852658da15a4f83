"""Thumbnails: a block-mean downsampling of a gradient, on its own device.

NOTE [Thumbnail views]
    A thumbnail is a block-mean downsampling, to at most `size`×`size`, of a 2-D view chosen by rank:
      0-D  → 1×1;                        1-D [n] → 1×n (a strip);
      2-D  → as is ([batch, features] of a Linear, [out, in] of a weight);
      3-D  [a, b, c] → [a·b, c] (rows: sample×position of a sequence, or sample×channel of Conv1d);
      4-D  [N, C, H, W] → sample 0 only, its C channels as a grid of H×W tiles (a conv gradient, or
           the heads of an attention map [B, heads, T, T]); empty grid cells are NaN;
      5-D+ → [prod(all but last), last].
    `TensorTrace.thumb_view` says which one was used, in words, so the UI can title the heatmap.
"""

from __future__ import annotations

import math

import torch

from gradscape.tracer.wire import matrix_shape


def fits_whole(shape: tuple[int, ...], size: int) -> bool:
    """True when the thumbnail is the whole tensor, uncompressed (see NOTE [Thumbnail views])."""
    if len(shape) == 4:
        return False
    rows, cols = matrix_shape(shape)
    return rows <= size and cols <= size


def _block_mean(v: torch.Tensor, dim: int, out: int) -> torch.Tensor:
    """Mean over consecutive blocks of `dim` so that at most `out` remain; the last block may be
    shorter. One pass over `v`, no window overlap (cheaper than adaptive pooling by 2-3x on CPU)."""
    n = v.shape[dim]
    if n <= out:
        return v
    k = math.ceil(n / out)
    full = (n // k) * k
    head = v.narrow(dim, 0, full)
    shape = list(v.shape)
    shape[dim:dim + 1] = [n // k, k]
    parts = [head.reshape(shape).mean(dim + 1)]
    if full < n:
        parts.append(v.narrow(dim, full, n - full).mean(dim, keepdim=True))
    return torch.cat(parts, dim) if len(parts) > 1 else parts[0]


def thumbnail(t: torch.Tensor, size: int) -> torch.Tensor:
    """A float32 2-D block-mean thumbnail of at most size×size, on t's device. Always a new tensor
    (never a view of a gradient: autograd may reuse that memory)."""
    x = t.detach()
    if x.is_complex():
        x = x.abs()
    x = x.float()
    r = x.dim()
    if r == 4 and x.shape[0] > 0 and x.shape[1] > 0:
        c, h, w = x.shape[1], x.shape[2], x.shape[3]
        gc = math.ceil(math.sqrt(c))
        gr = math.ceil(c / gc)
        th, tw = max(1, min(h, size // gr)), max(1, min(w, size // gc))
        tiles = _block_mean(_block_mean(x[0], 1, th), 2, tw)
        th, tw = tiles.shape[1], tiles.shape[2]
        pad = gr * gc - c
        if pad:
            tiles = torch.cat([tiles, tiles.new_full((pad, th, tw), math.nan)])
        return tiles.reshape(gr, gc, th, tw).permute(0, 2, 1, 3).reshape(gr * th, gc * tw).contiguous()
    v = x.reshape(matrix_shape(tuple(x.shape)))
    if v.shape[0] == 0 or v.shape[1] == 0:
        return v.new_zeros((0, 0))
    out = _block_mean(_block_mean(v, 0, size), 1, size)
    return out.clone() if out.data_ptr() == v.data_ptr() or out.data_ptr() == t.data_ptr() else out

