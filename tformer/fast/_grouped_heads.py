"""Grouped-query heads as views, and the batch split across threads: the helpers that the fast
attention kernels (``tformer.fast.attention``) and the online softmax
(``tformer.fast.flash_attention``) share. The modern block lists ``_grouped`` and
``_matmul_sum``, the appendix "The faster kernels, beside the equations" the rest.
"""
import math

import numpy as np

from tformer.core import parallel
from tformer.core.dtypes import matmul


def group_size(q, k):
    """G = H / H_kv, the query heads per key/value head (1 when q and k have the same leading axes)."""
    if q.shape[:-2] == k.shape[:-2]:
        return 1
    return q.shape[-3] // k.shape[-3]


def _group(a, G):
    """(..., H, T, ·) -> (..., H/G, G, T, ·): the head axis split in two, always a view (never a copy,
    so that results written into it land in ``a``)."""
    g = a.reshape(*a.shape[:-3], a.shape[-3] // G, G, *a.shape[-2:])
    if a.size and not np.may_share_memory(g, a):          # splitting one axis never copies
        raise RuntimeError("_group: the reshape copied")
    return g


def _grouped(G, q, k, v, *per_query):
    """The operands of grouped-query attention as views whose products broadcast K and V.

    ``q`` and every array of ``per_query`` (S or P, y or dy, dq, a mask; None passes through)
    become ``(..., H_kv, G, T, ·)``; ``k, v`` become ``(..., H_kv, 1, T_k, ·)``. A product
    ``q_g @ k_gᵀ`` then pairs query head (j, g) with key head j by a zero stride: no copy of K or
    V. The first axis stays the batch (or H_kv for a 3-D call), so splitting along it keeps q's
    and k's parts together. With G = 1 everything is returned as given: the multi-head path.
    """
    if G == 1:
        return (q, k, v, *per_query)
    return (_group(q, G), k[..., None, :, :], v[..., None, :, :],
            *(None if a is None else _group(a, G) for a in per_query))


def _matmul_sum(a, b, out, G):
    """out = a @ b; with grouped heads (G > 1, a and b grouped as in ``_grouped``) out = Σ_g a_g @ b_g.

    A key/value head is used by G query heads, so its gradient is the sum of the G heads'
    contributions (the forward's broadcast becomes a sum in the backward). The G products are one
    batched matmul into a temporary ``(..., H_kv, G, T_k, ·)``, then one reduction over g.
    """
    if G == 1:
        return matmul(a, b, out=out)
    return np.add.reduce(matmul(a, b), axis=-3, out=out)


def _split_axis(q):
    """(items, grain) for splitting attention along its first axis (the batch): each item is an
    independent set of heads. A 2-D call (no batch axis) is one item."""
    if q.ndim < 3:
        return 1, 1
    # q[0].size would index an empty batch: the size of one item is the product of the other axes
    return q.shape[0], parallel.grain_for(math.prod(q.shape[1:]) * 8)   # ~8 touched per element of q


def _items(lo, hi, ndim):
    """Index of items ``lo:hi`` along the first (batch) axis; everything for a 2-D (T, D) call."""
    return slice(lo, hi) if ndim >= 3 else Ellipsis


def _rows_of(mask, at, ndim):
    """The part of a broadcastable mask that applies to the items ``at`` of the first axis."""
    if at is not Ellipsis and mask.ndim == ndim and mask.shape[0] != 1:
        return mask[at]
    return mask
