"""Y = softmax(S) V,  S = scale · Q Kᵀ + M, and its gradients: the faster version of
``tformer.kernels.attention`` (same results; ``tests/kernels/test_fast_attention.py`` holds them equal).

What makes it faster:

- the batch is split across ``tformer.core.parallel`` threads, and S, P and the softmax share one
  ``(..., T_q, T_k)`` array (the softmax is written over the scores);
- ``is_causal=True`` skips the masked tiles: the queries are taken in tiles of ``_TILE`` = 64 rows,
  and a tile's scores, softmax and products use only the keys up to its last query (with n tiles,
  (n + 1)/2n of the work: 5/8 at T = 256);
- grouped-query attention (``k, v: (..., H_kv, T_k, ·)`` with H a multiple of H_kv): K and V are
  never repeated, the products broadcast each key/value head over its G = H / H_kv query heads by
  a zero stride (``_grouped``), and the backward sums the G heads (``_matmul_sum``);
- ``out=`` buffers (e.g. the heads of a ``(B, T, C)`` array, so that heads come out merged);
- float16/bfloat16: each product accumulates in float32 and the softmax runs in float32
  (``tformer.core.dtypes.matmul``); S, P and y are stored in the input's format;
- the scale multiplies Q (T × D) rather than S (T × T) in the forward, and dQ, dK rather than dS
  in the backward: the same numbers for a pass over T/D times fewer.

No argument checks: ``tformer.nn.functional`` checks once, where input enters.
"""
import math
from typing import NamedTuple

import numpy as np

from tformer.core import parallel
from tformer.core.dtypes import compute_dtype, matmul
from tformer.fast._grouped_heads import _grouped, _items, _matmul_sum, _rows_of, _split_axis, group_size
from tformer.fast.softmax import _softmax_backward_inplace, _softmax_inplace, _softmax_shifted_inplace

_TILE = 64
_SHIFTED = (np.dtype(np.float32), np.dtype(np.float64))   # causal softmax shifted by s_ii


class AttentionCache(NamedTuple):
    """What the backward pass needs: ``kernels.attention.AttentionCache`` and the causal tiles."""
    q: np.ndarray          # Q: (..., H, T_q, D)
    k: np.ndarray          # K: (..., H_kv, T_k, D)
    v: np.ndarray          # V: (..., H_kv, T_k, D_v)
    P: np.ndarray          # P = softmax(S): (..., H, T_q, T_k)
    scale: float
    tiles: list            # the query tiles [(a, b), ...] of the causal path, or None


def attention_forward(q, k, v, mask=None, scale=None, is_causal=False, out=None):
    """Y = softmax(scale · Q Kᵀ + M) V (``kernels.attention.attention_forward``), threaded, grouped,
    with causal tiles (``is_causal=True``) and ``out=``. ``mask``: boolean (True = may attend) or
    additive float, broadcasting to ``(..., T_q, T_k)``. Returns ``y, cache``."""
    G = group_size(q, k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    y = np.empty((*q.shape[:-1], v.shape[-1]), q.dtype) if out is None else out   # (..., T_q, D_v)
    if is_causal and q.ndim >= 3:
        return _causal_forward(q, k, v, scale, y, G)
    if is_causal:
        mask = _causal_mask(q.shape[-2])                 # a single (T, D) sequence: the plain path
    S = np.empty((*q.shape[:-1], k.shape[-2]), q.dtype)  # (..., T_q, T_k): scores, then P in place
    blocked, additive = _mask_parts(mask, S, G)
    qg, kg, vg, Sg, yg, blocked, additive = _grouped(G, q, k, v, S, y, blocked, additive)

    def seqs(lo, hi):
        at = _items(lo, hi, qg.ndim)
        # The scale multiplies Q (T_q × D) before the product rather than S (T_q × T_k) after it:
        # the same scores (exactly, when scale is a power of 2) for a pass over a T/D times smaller array.
        Sp = Sg[at]
        matmul(_scaled(qg[at], scale), kg[at].swapaxes(-1, -2), out=Sp)
        if blocked is not None:
            np.copyto(Sp, -np.inf, where=_rows_of(blocked, at, Sg.ndim))
        elif additive is not None:
            Sp += _rows_of(additive, at, Sg.ndim)
        _softmax_inplace(Sp)       # softmax_forward's arithmetic, written over S: no second T×T array
        matmul(Sp, vg[at], out=yg[at])

    parallel.parallel_for(seqs, *_split_axis(qg))
    return y, AttentionCache(q, k, v, S, scale, None)


def _mask_parts(mask, S, G):
    """The mask as (blocked, additive): a boolean mask's blocked entries ~M, or a float mask in S's
    dtype (the other None); with grouped heads (G > 1) broadcast to S's shape (a view), to be
    grouped like S."""
    blocked = None if mask is None or mask.dtype != bool else ~mask
    additive = None if mask is None or mask.dtype == bool else mask.astype(S.dtype, copy=False)
    if G > 1:
        blocked, additive = (None if m is None else np.broadcast_to(m, S.shape) for m in (blocked, additive))
    return blocked, additive


def _causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool))


def _tiles(T):
    """Query tiles ``[(a, b), ...]`` of the causal path, ``_TILE`` rows each (the last may be shorter).

    Smaller tiles skip more of the masked triangle but make each batched product smaller; on
    rows of 64 keys and more, NumPy's per-matrix BLAS calls cost more than the skipped work saves
    (measured: 32-row tiles were slower than 64-row ones at T = 64, 128 and 256).
    """
    return [(a, min(a + _TILE, T)) for a in range(0, T, _TILE)]


def _causal_forward(q, k, v, scale, y, G=1):
    """``attention_forward`` with the causal mask, tile by tile (see there). Tile [a, b) of the
    queries needs keys [0, b) only; inside the tile, query i sees keys j ≤ i. ``G``: query heads
    per key/value head (the products run on the views of ``_grouped``)."""
    T = q.shape[-2]
    S = np.empty((*q.shape[:-1], T), q.dtype)            # (..., T, T): P, exactly 0 above the diagonal
    tiles = _tiles(T)
    # The masked corner of a diagonal tile as an additive mask, −inf above the diagonal and 0 on
    # and below it: one add over the tile (half the time of a masked copy, and the same scores).
    above = {n: np.where(np.tri(n, dtype=bool), 0, -np.inf).astype(q.dtype)
             for n in {b - a for a, b in tiles}}
    qg, kg, vg, Sg, yg = _grouped(G, q, k, v, S, y)
    shift = q.dtype in _SHIFTED

    def seqs(lo, hi):
        qs = _scaled(qg[lo:hi], scale)
        for a, b in tiles:
            St = Sg[lo:hi, ..., a:b, :b]                 # (..., b − a, b): this tile's live scores
            matmul(qs[..., a:b, :], kg[lo:hi, ..., :b, :].swapaxes(-1, -2), out=St)
            with np.errstate(invalid="ignore"):          # +inf − inf: NaN, refused below
                St[..., a:b] += above[b - a]             # query i sees keys j ≤ i
            # P of the tile, over its scores, each row shifted by the query's own score s_ii
            # (the diagonal of the tile: column a + r of row r), not by its maximum.
            if not (shift and _softmax_shifted_inplace(
                    St, np.diagonal(St, a, -2, -1)[..., None].copy())):
                if shift:                                # an exponent overflowed: start again
                    matmul(qs[..., a:b, :], kg[lo:hi, ..., :b, :].swapaxes(-1, -2), out=St)
                    with np.errstate(invalid="ignore"):
                        St[..., a:b] += above[b - a]
                _softmax_inplace(St)                     # shifted by the row maximum
            Sg[lo:hi, ..., a:b, b:] = 0                  # keys after the tile: P = 0
            matmul(St, vg[lo:hi, ..., :b, :], out=yg[lo:hi, ..., a:b, :])

    parallel.parallel_for(seqs, *_split_axis(qg))
    return y, AttentionCache(q, k, v, S, scale, tiles)


def _scaled(q, scale):
    """scale · Q, a new array in Q's format (float16/bfloat16: multiplied in float32, rounded once)."""
    return np.multiply(q, scale, dtype=compute_dtype(q.dtype)).astype(q.dtype, copy=False)


def attention_backward(dy, cache, out=None):
    """dV = Pᵀ dY, dP = dY Vᵀ, dS = P ⊙ (dP − rowsum(dP ⊙ P)), dQ = scale · dS K, dK = scale · dSᵀ Q
    (``kernels.attention.attention_backward``), threaded, grouped (dK_j = scale · Σ_g dS_(j,g)ᵀ Q_(j,g)
    and dV_j = Σ_g P_(j,g)ᵀ dY_(j,g)), tile by tile after a causal forward.
    ``out=(dq, dk, dv)``: arrays (or views, e.g. into one fused ``(B, T, 3C)`` gradient) to write
    the three gradients into, instead of new arrays; they are returned.
    """
    q, k, v, P, scale, tiles = cache
    if out is None:
        out = tuple(np.empty(a.shape, a.dtype) for a in (q, k, v))
    G = group_size(q, k)
    if tiles is not None:
        return _causal_backward(dy, q, k, v, P, scale, tiles, out, G)
    dq, dk, dv = out
    qg, kg, vg, Pg, dyg, dqg = _grouped(G, q, k, v, P, dy, dq)

    def seqs(lo, hi):
        at = _items(lo, hi, qg.ndim)
        Pp, dyp = Pg[at], dyg[at]
        _matmul_sum(Pp.swapaxes(-1, -2), dyp, dv[at], G)        # dV = Pᵀ dY   (..., T_k, D_v)
        # dS = P ⊙ (dP − rowsum(dP ⊙ P)), written over dP = dY Vᵀ; not yet multiplied by the scale
        dS = _softmax_backward_inplace(matmul(dyp, vg[at].swapaxes(-1, -2)), Pp)
        matmul(dS, kg[at], out=dqg[at])
        _matmul_sum(dS.swapaxes(-1, -2), qg[at], dk[at], G)
        # The scale multiplies dQ and dK (T × D each) instead of dS (T × T).
        dqg[at] *= scale                                        # dQ = scale · dS K   (..., T_q, D)
        dk[at] *= scale                                         # dK = scale · dSᵀ Q  (..., T_k, D)

    parallel.parallel_for(seqs, *_split_axis(qg))
    return dq, dk, dv


def _causal_backward(dy, q, k, v, P, scale, tiles, out, G=1):
    """``attention_backward`` tile by tile, skipping the tiles where P = 0. Per query tile [a, b):
    dP, dS and dQ use keys [0, b). Per key tile [c, d): dV = P[c:, c:d]ᵀ dY[c:] and
    dK = dS[c:, c:d]ᵀ Q[c:], since no query before c sees those keys: each is one product, not a
    sum of pieces (with grouped heads, one batched product and its sum over the G heads)."""
    dq, dk, dv = out
    dS = parallel.scratch("attention_dS", P.shape, P.dtype)   # (..., T, T), only the live tiles written
    qg, kg, vg, Pg, dSg, dyg, dqg = _grouped(G, q, k, v, P, dS, dy, dq)

    def seqs(lo, hi):
        Pp, dSp, dyp, qs, ks, vs = Pg[lo:hi], dSg[lo:hi], dyg[lo:hi], qg[lo:hi], kg[lo:hi], vg[lo:hi]
        for a, b in tiles:
            St = Pp[..., a:b, :b]
            dSt = dSp[..., a:b, :b]
            matmul(dyp[..., a:b, :], vs[..., :b, :].swapaxes(-1, -2), out=dSt)   # dP tile
            _softmax_backward_inplace(dSt, St)           # P ⊙ (dP − ⟨dP, P⟩), in place; no scale yet
            matmul(dSt, ks[..., :b, :], out=dqg[lo:hi, ..., a:b, :])
        for c, d in tiles:
            _matmul_sum(Pp[..., c:, c:d].swapaxes(-1, -2), dyp[..., c:, :], dv[lo:hi, ..., c:d, :], G)
            _matmul_sum(dSp[..., c:, c:d].swapaxes(-1, -2), qs[..., c:, :], dk[lo:hi, ..., c:d, :], G)
        # The scale multiplies dQ and dK (T × D each) instead of dS (T × T): the same product,
        # a pass over T/D times fewer numbers.
        dqg[lo:hi] *= scale                              # dQ = scale · dS K
        dk[lo:hi] *= scale                               # dK = scale · dSᵀ Q
    parallel.parallel_for(seqs, *_split_axis(qg))
    return dq, dk, dv
