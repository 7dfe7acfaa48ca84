"""Attention that never stores the T_q × T_k matrix: the online softmax (FlashAttention's algorithm).

The forward pass walks the keys in tiles and keeps, per query row, the running maximum m, the
running sum ℓ = Σ exp(s − m) and the output accumulated so far, o = Σ exp(s − m) v. A new tile
with scores s' (tile maximum m') is merged by rescaling what came before:

    m_new = max(m, m'),   ℓ ← e^(m − m_new) ℓ + Σ e^(s' − m_new),
                          o ← e^(m − m_new) o + e^(s' − m_new) V'

and after the last tile y = o / ℓ: exactly softmax(S) V (the chapter "Attention that never stores
T × T" derives it with SymPy). Only y and each row's m and ℓ are kept, as in FlashAttention-1;
FlashAttention-2 stores their log-sum-exp L = m + log ℓ as one number instead. Kept apart, they
spare the recomputed P the rounding of that sum (near m = ±1e4 it is 1e-12 relative in
float64). The backward pass recomputes each tile's probabilities P = exp(S − m) / ℓ from Q, K,
m and ℓ, and needs rowsum(dP ⊙ P) only as D = rowsum(dY ⊙ Y), which is the same number (both
FlashAttention papers compute this D). Memory: O(T·D) per head instead of O(T²).

The tile loops are the algorithm; inside a tile every product is one batched BLAS call over all
the leading axes (batch and heads), so there is no Python loop over B or H. Grouped-query attention
reuses ``_grouped`` and ``_matmul_sum`` (kernels/_grouped_heads.py), as the plain kernel's fast
version does (fast/attention.py).
"""
import math
from typing import NamedTuple

import numpy as np

from .. import parallel
from .._dtypes import compute_dtype
from ._grouped_heads import _grouped, _matmul_sum, _split_axis, group_size

#: Query tile size (rows of Q per step). BLOCK_Q × BLOCK_K was chosen from the 5 × 5 pairs of
#: 32 … 512 measured by ``python -m tformer online-softmax --parts tiles`` (book/data/
#: online_softmax.json) on the machine this was written on (AMD EPYC, 32 KiB L1d and 1 MiB L2 per
#: core): forward + backward of causal attention at B = 4, H = 4, D = 32, float32. The fastest
#: pairs hold one block of scores over all B·H heads of 1 MiB (b_q·b_k = 128²); 128 × 128 came
#: first in two of three runs and within 6 % of the first in the third.
BLOCK_Q = 128
#: Key tile size (rows of K and V per step); see ``BLOCK_Q``.
BLOCK_K = 128


class FlashAttentionCache(NamedTuple):
    """What the backward pass needs: the inputs and output, each row's maximum m and sum ℓ (P is
    recomputed from them), and how the forward pass ran (mask, causal, tile sizes)."""
    q: np.ndarray                # Q: (..., T_q, D)
    k: np.ndarray                # K: (..., T_k, D)
    v: np.ndarray                # V: (..., T_k, D_v)
    y: np.ndarray                # Y: (..., T_q, D_v)
    m: np.ndarray                # m: (..., T_q), each row's largest score
    ell: np.ndarray              # ℓ = Σ_j e^(s_j − m): (..., T_q)
    scale: float
    blocked: object              # the boolean mask's blocked entries (a broadcast view) or None
    additive: object             # the additive mask (a broadcast view) or None
    is_causal: bool
    block_q: int
    block_k: int


def flash_attention_forward(q, k, v, mask=None, scale=None, is_causal=False, out=None,
                            block_q=None, block_k=None):
    """Y = softmax(S) V,  S = scale · Q Kᵀ + M, by the online softmax over key tiles; S is never stored.

    Shapes as ``attention_forward``: ``q: (..., T_q, D)``, ``k: (..., T_k, D)``,
    ``v: (..., T_k, D_v)`` -> ``y: (..., T_q, D_v)``; grouped-query attention when the head axis
    −3 of k and v is a divisor of q's. ``mask`` broadcasts to ``(..., T_q, T_k)`` (boolean,
    True = may attend, or additive float); it is read tile by tile, never expanded.
    ``is_causal=True``: query i sees keys j ≤ i + T_k − T_q (``causal_mask(T_q, T_k)``), and the
    key tiles entirely above the diagonal are skipped; it may be combined with ``mask`` (e.g. a
    padding mask), which is then applied as well. A query whose keys are all masked gets y = 0
    (and zero gradients), never NaN. ``block_q``, ``block_k``: tile sizes (default ``BLOCK_Q``,
    ``BLOCK_K``). ``out``: an array or view to write y into (it is kept, not copied, for the
    backward pass: do not overwrite it before then).
    float16/bfloat16 (mixed precision): each tile is upcast to float32, and the scores, the
    exponentials, m, ℓ and the partial output are float32; y is rounded to the input's format once,
    at the end of its query tile.
    Returns ``y, cache``; the cache holds q, k, v, y and, per row of S, its maximum
    ``m: (..., T_q)`` and its sum ``ℓ = Σ_j e^(s_j − m): (..., T_q)`` (ℓ = 0 for a row with no
    visible key): P = e^(S − m) / ℓ, the terms of the log-sum-exp L = m + log ℓ kept apart.
    """
    G, scale, blocked, additive = _prepare(q, k, mask, scale)
    bq, bk = BLOCK_Q if block_q is None else int(block_q), BLOCK_K if block_k is None else int(block_k)
    y = np.empty((*q.shape[:-1], v.shape[-1]), q.dtype) if out is None else out
    cd = compute_dtype(q.dtype)                 # the tiles' format: float32 for float16/bfloat16
    m_all = np.empty(q.shape[:-1], cd)                                  # (..., T_q): row max m
    ell_all = np.empty(q.shape[:-1], cd)                                # (..., T_q): ℓ = Σ e^(s − m)
    T_q, T_k = q.shape[-2], k.shape[-2]
    q3, k3, v3, y3, m3, ell3, blocked, additive = _batched(q, k, v, y, m_all[..., None],
                                                           ell_all[..., None], blocked, additive)
    qg, kg, vg, yg, mg, ellg, blocked, additive = _grouped(G, q3, k3, v3, y3, m3, ell3, blocked, additive)
    low = np.finfo(cd).min             # the running max starts here, not at −inf: see _merge_tile

    def seqs(lo, hi):
        with np.errstate(invalid="ignore"):       # NaN or +inf scores: reported below, by name
            tiles(lo, hi)

    def tiles(lo, hi):
        lead = (hi - lo, *qg.shape[1:-2])                               # (n, ..., ·, ·) of a tile
        S_buf = np.empty((*lead, bq, bk), cd)                           # one tile of scores
        qs_buf = np.empty((*lead, bq, q.shape[-1]), cd)
        pv_buf = np.empty((*lead, bq, v.shape[-1]), cd)
        ones = np.ones((bk, 1), cd)
        k_up, v_up, o_up = _upcast_buffers(q.dtype, cd, (hi - lo, *kg.shape[1:-2]), lead, bq, bk,
                                           k.shape[-1], v.shape[-1], v.shape[-1])
        for a, b in _ranges(T_q, bq):
            nq = b - a
            qs = np.multiply(qg[lo:hi, ..., a:b, :], scale, out=qs_buf[..., :nq, :], dtype=cd)
            o = yg[lo:hi, ..., a:b, :] if o_up is None else o_up[..., :nq, :]   # o accumulates in y
            m = np.full((*lead, nq, 1), low, cd)                        # running max  (.., nq, 1)
            ell = np.zeros((*lead, nq, 1), cd)                          # running sum  (.., nq, 1)
            for i, (c, d) in enumerate(_ranges(_key_end(a, b, T_q, T_k, is_causal), bk)):
                S = _scores(qs, _up(kg[lo:hi, ..., c:d, :], k_up), S_buf, a, b, c, d, lo, hi,
                            blocked, additive, is_causal, T_k - T_q)
                m = _merge_tile(S, m, ell, o, _up(vg[lo:hi, ..., c:d, :], v_up), pv_buf, ones,
                                first=i == 0)
            if np.isnan(m).any() or np.isposinf(m).any():
                raise ValueError("scores: contain NaN or +inf (from q, k or the mask); the softmax "
                                 "of such a row is undefined")
            empty = ell == 0                       # no visible key (or no key tile at all)
            if empty.any():                        # P = 0 on these rows; with no key tile at all
                o[np.broadcast_to(empty, o.shape)] = 0   # o was never written
            np.divide(o, ell, out=o, where=~empty)                      # y = o / ℓ
            if o_up is not None:
                np.copyto(yg[lo:hi, ..., a:b, :], o, casting="same_kind")   # rounded once
            mg[lo:hi, ..., a:b, :] = m
            ellg[lo:hi, ..., a:b, :] = ell

    parallel.parallel_for(seqs, *_split_axis(qg))
    return y, FlashAttentionCache(q, k, v, y, m_all, ell_all, scale, blocked, additive, is_causal, bq, bk)


def _merge_tile(S, m, ell, o, v, pv_buf, ones, first):
    """Merge one key tile into the running (m, ℓ, o) of a query tile, in place; returns the new m.

    ``S: (.., nq, nk)`` holds the tile's scores and is overwritten by exp(S − m_new).
    The running max starts at the dtype's lowest finite number instead of −inf, so that
    m − m_new and S − m_new never compute −inf − (−inf): a row whose keys so far are all masked
    keeps ℓ = 0 and o = 0, and its scale factor e^(m − m_new) is 1 or 0, never NaN.
    """
    nk = S.shape[-1]
    m_new = np.maximum(m, S.max(axis=-1, keepdims=True))                # (.., nq, 1)
    S -= m_new
    np.exp(S, out=S)                                                    # e^(s − m_new)
    rowsum = np.matmul(S, ones[:nk])                                    # Σ_j e^(s_j − m_new), BLAS
    if first:                                                           # ℓ = 0, o = 0 before
        ell += rowsum
        np.matmul(S, v, out=o)
        return m_new
    alpha = np.exp(m - m_new)                                           # e^(m − m_new) ≤ 1
    ell *= alpha
    ell += rowsum                                                       # ℓ ← α ℓ + Σ e^(s − m_new)
    o *= alpha
    o += np.matmul(S, v, out=pv_buf[..., :S.shape[-2], :])              # o ← α o + e^(S − m_new) V
    return m_new


def _scores(qs, k, S_buf, a, b, c, d, lo, hi, blocked, additive, is_causal, offset):
    """The scores S = (scale·Q_a) K_cᵀ of query tile [a, b) and key tile [c, d), masked.

    Written into ``S_buf``; returns the view ``(.., b − a, d − c)``. Masked entries are −inf: the
    user's mask (its tile, a view of the broadcast mask) and, for ``is_causal``, the keys
    j > i + offset of a tile that crosses the diagonal."""
    S = S_buf[..., :b - a, :d - c]
    np.matmul(qs, k.swapaxes(-1, -2), out=S)
    if additive is not None:
        S += additive[lo:hi, ..., a:b, c:d]
    if blocked is not None:
        np.copyto(S, -np.inf, where=blocked[lo:hi, ..., a:b, c:d])
    if is_causal and d - 1 > a + offset:                                # some key after some query
        np.copyto(S, -np.inf, where=_above(a, b, c, d, offset))
    return S


def _above(a, b, c, d, offset):
    """(b − a, d − c) boolean: key j = c … d−1 comes after what query i = a … b−1 may see,
    j > i + offset."""
    return np.arange(c, d)[None, :] > np.arange(a + offset, b + offset)[:, None]


def flash_attention_backward(dy, cache, out=None):
    """dV = Pᵀ dY,  dS = P ⊙ (dY Vᵀ − D),  dQ = scale · dS K,  dK = scale · dSᵀ Q,  tile by tile.

    In the forward pass P = exp(S − L) = exp(S − m) / ℓ row by row, so each tile of P is
    recomputed from Q, K and the stored m and ℓ (one more Q Kᵀ product and exponential per tile:
    the price of not storing P). The softmax VJP needs rowsum(dP ⊙ P) for each row; since
    dP = dY Vᵀ and Y = P V, rowsum(dP ⊙ P) = Σ_j P_ij (dY_i · V_j) = dY_i · Y_i, so
    D = rowsum(dY ⊙ Y) is computed once, O(T·D_v), before the loop. The division by ℓ is moved
    onto the small operands: with E = exp(S − m), dV = Eᵀ (dY/ℓ) and dS = E ⊙ ((dY/ℓ) Vᵀ − D/ℓ),
    so that a tile of scores is touched by the subtraction and the exponential only.
    dQ sums over key tiles, dK and dV over query tiles. Grouped-query attention: dK and dV of a
    key/value head sum its G query heads (``_matmul_sum``).
    Shapes: ``dy: (..., T_q, D_v)`` -> ``(dq, dk, dv)`` shaped like ``q, k, v``.
    ``out=(dq, dk, dv)``: arrays or views to write into, as ``attention_backward``.
    """
    q, k, v, y, m_all, ell_all, scale, blocked, additive, is_causal, bq, bk = cache
    dq, dk, dv = tuple(np.empty(a.shape, a.dtype) for a in (q, k, v)) if out is None else out
    G = group_size(q, k)
    T_q, T_k = q.shape[-2], k.shape[-2]
    cd = m_all.dtype                            # the tiles' format: float32 for float16/bfloat16
    Dlt = np.vecdot(dy.astype(cd, copy=False), y.astype(cd, copy=False))[..., None]   # D = rowsum(dY ⊙ Y)
    inv = np.divide(1, ell_all, out=np.zeros_like(ell_all), where=ell_all > 0)[..., None]   # 1/ℓ
    # (0 for a row with no visible key: its dY/ℓ and D/ℓ are 0, and so are its gradients)
    Dlt *= inv                                                          # D/ℓ
    arrays = _batched(q, k, v, dy, m_all[..., None], inv, Dlt, dq, dk, dv)
    q3, k3, v3, dy3, m3, inv3, D3, dq3, dk3, dv3 = arrays
    qg, kg, vg, dyg, mg, invg, Dg, dqg = _grouped(G, q3, k3, v3, dy3, m3, inv3, D3, dq3)

    def seqs(lo, hi):
        lead = (hi - lo, *qg.shape[1:-2])
        E_buf = np.empty((*lead, bq, bk), cd)                           # E = exp(S − m) of one tile
        dP_buf = np.empty((*lead, bq, bk), cd)                          # dP/ℓ, then dS/scale
        qs_buf = np.empty((*lead, bq, q.shape[-1]), cd)
        dys_buf = np.empty((*lead, bq, v.shape[-1]), cd)
        dq_buf = np.empty((*lead, bq, q.shape[-1]), cd)
        kv_lead = (hi - lo, *dk3.shape[1:-2])                           # (n, ..., H_kv)
        dk_buf = np.empty((*kv_lead, bk, k.shape[-1]), cd)
        dv_buf = np.empty((*kv_lead, bk, v.shape[-1]), cd)
        k_up, v_up, dq_up = _upcast_buffers(q.dtype, cd, (hi - lo, *kg.shape[1:-2]), lead, bq, bk,
                                            k.shape[-1], v.shape[-1], q.shape[-1])
        # dK and dV sum over query tiles: in place, or (float16/bfloat16) in float32 arrays
        dk_acc = dk3[lo:hi] if dq_up is None else np.empty((hi - lo, *dk3.shape[1:]), cd)
        dv_acc = dv3[lo:hi] if dq_up is None else np.empty((hi - lo, *dv3.shape[1:]), cd)
        dk_acc[...] = 0
        dv_acc[...] = 0
        for a, b in _ranges(T_q, bq):
            nq = b - a
            qs = np.multiply(qg[lo:hi, ..., a:b, :], scale, out=qs_buf[..., :nq, :], dtype=cd)
            dys = np.multiply(dyg[lo:hi, ..., a:b, :], invg[lo:hi, ..., a:b, :],
                              out=dys_buf[..., :nq, :], dtype=cd)       # dY/ℓ
            mt, Dt = mg[lo:hi, ..., a:b, :], Dg[lo:hi, ..., a:b, :]
            dqt = dqg[lo:hi, ..., a:b, :] if dq_up is None else dq_up[..., :nq, :]
            end = _key_end(a, b, T_q, T_k, is_causal)
            for i, (c, d) in enumerate(_ranges(end, bk)):
                nk = d - c
                kt, vt = _up(kg[lo:hi, ..., c:d, :], k_up), _up(vg[lo:hi, ..., c:d, :], v_up)
                E = _scores(qs, kt, E_buf, a, b, c, d, lo, hi, blocked, additive, is_causal, T_k - T_q)
                E -= mt
                np.exp(E, out=E)                                        # E = exp(S − m) = ℓ P
                dvt = _matmul_sum(E.swapaxes(-1, -2), dys, dv_buf[..., :nk, :], G)
                dv_acc[..., c:d, :] += dvt                              # dV_c += Pᵀ dY_a
                dS = np.matmul(dys, vt.swapaxes(-1, -2), out=dP_buf[..., :nq, :nk])   # dP/ℓ
                dS -= Dt
                dS *= E                                                 # dS/scale = P ⊙ (dP − D)
                if i == 0:
                    np.matmul(dS, kt, out=dqt)
                else:
                    dqt += np.matmul(dS, kt, out=dq_buf[..., :nq, :])   # dQ_a/scale += dS K_c
                dkt = _matmul_sum(dS.swapaxes(-1, -2), qs, dk_buf[..., :nk, :], G)
                dk_acc[..., c:d, :] += dkt                              # dK_c += dSᵀ (scale·Q_a)
            if end == 0:
                dqt[...] = 0                                            # no key: no gradient
            dqt *= scale                                                # dQ = scale · dS K
            if dq_up is not None:
                np.copyto(dqg[lo:hi, ..., a:b, :], dqt, casting="same_kind")
        if dq_up is not None:                                           # rounded once
            np.copyto(dk3[lo:hi], dk_acc, casting="same_kind")
            np.copyto(dv3[lo:hi], dv_acc, casting="same_kind")

    parallel.parallel_for(seqs, *_split_axis(qg))
    return dq, dk, dv


def _upcast_buffers(dtype, cd, kv_lead, lead, bq, bk, D_k, D_v, D_out):
    """float16/bfloat16 input: float32 buffers for a key tile ``(.., bk, D_k)``, a value tile
    ``(.., bk, D_v)`` and a query tile's result ``(.., bq, D_out)``. (None, None, None) when the
    input is already in the compute format ``cd``."""
    if dtype == cd:
        return None, None, None
    return (np.empty((*kv_lead, bk, D_k), cd), np.empty((*kv_lead, bk, D_v), cd),
            np.empty((*lead, bq, D_out), cd))


def _up(a, buf):
    """The tile ``a`` in the compute format: ``a`` itself, or its values upcast into ``buf``."""
    if buf is None:
        return a
    view = buf[..., :a.shape[-2], :a.shape[-1]]
    np.copyto(view, a)
    return view


def _prepare(q, k, mask, scale):
    """(G, scale, blocked, additive): the query heads per key/value head, the scale (1/√D unless
    given), and the mask split into a boolean "blocked" or an additive float array (each broadcast
    to the scores' shape as a view, or None). The arguments were checked by ``tformer.functional``."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = (*q.shape[:-1], k.shape[-2])                               # (..., T_q, T_k)
    if mask is None:
        return group_size(q, k), scale, None, None
    if mask.dtype == bool:
        return group_size(q, k), scale, np.broadcast_to(~mask, scores), None
    return (group_size(q, k), scale, None,
            np.broadcast_to(mask.astype(compute_dtype(q.dtype), copy=False), scores))


def _batched(*arrays):
    """A 2-D call ``(T, ·)`` gets a leading axis of one item, so that every tile is ``(n, ..., ·, ·)``
    and the work splits along axis 0; other arrays pass through (None too)."""
    if arrays[0].ndim >= 3:
        return arrays
    return tuple(None if a is None else a[None] for a in arrays)


def _ranges(n, size):
    """``[(0, size), (size, 2·size), …]`` covering [0, n); the last range may be shorter."""
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def _key_end(a, b, T_q, T_k, is_causal):
    """The keys [0, end) that query tile [a, b) may see: all T_k, or with ``is_causal`` those up to
    the tile's last query, b − 1 + (T_k − T_q). Key tiles beyond are never computed."""
    return min(T_k, b + T_k - T_q) if is_causal else T_k
