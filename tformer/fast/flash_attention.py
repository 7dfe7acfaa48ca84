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
reuses ``_grouped`` and ``_matmul_sum`` (fast/_grouped_heads.py), as the plain kernel's fast
version does (fast/attention.py).
"""
import math
from typing import NamedTuple

import numpy as np

from tformer.core import parallel
from tformer.core.dtypes import compute_dtype
from tformer.fast._grouped_heads import _grouped, _matmul_sum, _split_axis, group_size

#: Query tile size (rows of Q per step). BLOCK_Q × BLOCK_K was chosen from the 5 × 5 pairs of
#: 32 … 512 measured by ``python -m tformer online-softmax --parts tiles`` (book/data/
#: online_softmax.json) on an AMD EPYC (32 KiB L1d and 1 MiB L2 per
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
    arrays = _batched(q, k, v, y, m_all[..., None], ell_all[..., None], blocked, additive)
    arrays = _grouped(G, *arrays)               # Q, K, V, Y, m, ℓ and the mask, as tiles see them

    def seqs(lo, hi):                           # the sequences lo … hi − 1, on one thread
        with np.errstate(invalid="ignore"):     # NaN or +inf scores: reported by _divide, by name
            _forward_seqs(*_part(arrays, lo, hi), scale, is_causal, bq, bk)

    parallel.parallel_for(seqs, *_split_axis(arrays[0]))
    blocked, additive = arrays[-2:]             # kept as the tiles see them, for the backward pass
    return y, FlashAttentionCache(q, k, v, y, m_all, ell_all, scale, blocked, additive, is_causal, bq, bk)


def _forward_seqs(q, k, v, y, m_out, ell_out, blocked, additive, scale, is_causal, bq, bk):
    """The forward pass of some sequences (the first axis of every array), one query tile at a time:
    merge its key tiles one by one into the running (m, ℓ, o), then y = o / ℓ."""
    T_q, T_k = q.shape[-2], k.shape[-2]
    buf = _forward_buffers(q, k, v, bq, bk, m_out.dtype)
    for a, b in _ranges(T_q, bq):
        qs = np.multiply(q[..., a:b, :], scale, out=buf.qs[..., :b - a, :], dtype=m_out.dtype)
        o = y[..., a:b, :] if buf.o is None else buf.o[..., :b - a, :]     # o accumulates in y
        m = np.full((*qs.shape[:-1], 1), buf.low, m_out.dtype)             # running max  (.., nq, 1)
        ell = np.zeros((*qs.shape[:-1], 1), m_out.dtype)                   # running sum  (.., nq, 1)
        for i, (c, d) in enumerate(_ranges(_key_end(a, b, T_q, T_k, is_causal), bk)):
            S = _scores(qs, _up(k[..., c:d, :], buf.k), buf.S, a, b, c, d,
                        blocked, additive, is_causal, T_k - T_q)
            m = _merge_tile(S, m, ell, o, _up(v[..., c:d, :], buf.v), buf.pv, buf.ones,
                            first=i == 0)
        _divide(o, m, ell)                                                 # y = o / ℓ
        if buf.o is not None:
            np.copyto(y[..., a:b, :], o, casting="same_kind")              # rounded once
        m_out[..., a:b, :] = m
        ell_out[..., a:b, :] = ell


class _ForwardBuffers(NamedTuple):
    """One thread's scratch for the forward pass: a tile of scores S, of scale·Q and of e^S V, a
    column of ones (row sums by BLAS), float32 copies of a key and value tile and of a query
    tile's output (float16/bfloat16 input; else None), and the running max's start ``low``."""
    S: np.ndarray
    qs: np.ndarray
    pv: np.ndarray
    ones: np.ndarray
    k: object
    v: object
    o: object
    low: float


def _forward_buffers(q, k, v, bq, bk, cd):
    """The ``_ForwardBuffers`` for tiles of ``bq`` queries and ``bk`` keys of these sequences."""
    lead = q.shape[:-2]                                                 # (n, ..., ·) of a tile
    k_up, v_up, o_up = _upcast_buffers(q.dtype, cd, k.shape[:-2], lead, bq, bk,
                                       k.shape[-1], v.shape[-1], v.shape[-1])
    return _ForwardBuffers(np.empty((*lead, bq, bk), cd), np.empty((*lead, bq, q.shape[-1]), cd),
                           np.empty((*lead, bq, v.shape[-1]), cd), np.ones((bk, 1), cd),
                           k_up, v_up, o_up,
                           np.finfo(cd).min)   # the running max starts here, not at −inf


def _divide(o, m, ell):
    """y = o / ℓ for one query tile, in place in ``o``; a row with no visible key (ℓ = 0) is 0.
    A NaN or +inf running maximum means a NaN or +inf score: raised here."""
    if np.isnan(m).any() or np.isposinf(m).any():
        raise ValueError("scores: contain NaN or +inf (from q, k or the mask); the softmax "
                         "of such a row is undefined")
    empty = ell == 0                           # no visible key (or no key tile at all)
    if empty.any():                            # P = 0 on these rows; with no key tile at all
        o[np.broadcast_to(empty, o.shape)] = 0   # o was never written
    np.divide(o, ell, out=o, where=~empty)


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


def _scores(qs, k, S_buf, a, b, c, d, blocked, additive, is_causal, offset):
    """The scores S = (scale·Q_a) K_cᵀ of query tile [a, b) and key tile [c, d), masked.

    Written into ``S_buf``; returns the view ``(.., b − a, d − c)``. Masked entries are −inf: the
    user's mask (its tile, a view of the broadcast mask) and, for ``is_causal``, the keys
    j > i + offset of a tile that crosses the diagonal."""
    S = S_buf[..., :b - a, :d - c]
    np.matmul(qs, k.swapaxes(-1, -2), out=S)
    if additive is not None:
        S += additive[..., a:b, c:d]
    if blocked is not None:
        np.copyto(S, -np.inf, where=blocked[..., a:b, c:d])
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
    cd = m_all.dtype                            # the tiles' format: float32 for float16/bfloat16
    Dlt = np.vecdot(dy.astype(cd, copy=False), y.astype(cd, copy=False))[..., None]   # D = rowsum(dY ⊙ Y)
    inv = np.divide(1, ell_all, out=np.zeros_like(ell_all), where=ell_all > 0)[..., None]   # 1/ℓ
    # (0 for a row with no visible key: its dY/ℓ and D/ℓ are 0, and so are its gradients)
    Dlt *= inv                                                          # D/ℓ
    q3, k3, v3, dy3, m3, inv3, D3, dq3, dk3, dv3 = _batched(q, k, v, dy, m_all[..., None], inv, Dlt,
                                                            dq, dk, dv)
    arrays = (*_grouped(G, q3, k3, v3, dy3, m3, inv3, D3, dq3), dk3, dv3, blocked, additive)

    def seqs(lo, hi):                           # the sequences lo … hi − 1, on one thread
        _backward_seqs(*_part(arrays, lo, hi), scale, is_causal, bq, bk, G)

    parallel.parallel_for(seqs, *_split_axis(arrays[0]))
    return dq, dk, dv


def _backward_seqs(q, k, v, dy, m, inv, Dl, dq, dk, dv, blocked, additive, scale, is_causal, bq, bk,
                   G):
    """The backward pass of some sequences (the first axis of every array), one query tile at a
    time: dQ_a sums over its key tiles; dK and dV sum over the query tiles, in ``dk_acc, dv_acc``."""
    T_q, T_k = q.shape[-2], k.shape[-2]
    buf = _backward_buffers(q, k, v, dk, bq, bk, m.dtype)
    dk_acc, dv_acc = _accumulators(dk, dv, m.dtype, buf.dq_up is not None)
    for a, b in _ranges(T_q, bq):
        qs = np.multiply(q[..., a:b, :], scale, out=buf.qs[..., :b - a, :], dtype=m.dtype)
        dys = np.multiply(dy[..., a:b, :], inv[..., a:b, :], out=buf.dys[..., :b - a, :],
                          dtype=m.dtype)                                # dY/ℓ
        dqt = dq[..., a:b, :] if buf.dq_up is None else buf.dq_up[..., :b - a, :]
        end = _key_end(a, b, T_q, T_k, is_causal)
        for i, (c, d) in enumerate(_ranges(end, bk)):
            kt, vt = _up(k[..., c:d, :], buf.k), _up(v[..., c:d, :], buf.v)
            E = _scores(qs, kt, buf.E, a, b, c, d, blocked, additive, is_causal, T_k - T_q)
            _tile_backward(E, m[..., a:b, :], Dl[..., a:b, :], qs, dys, kt, vt, dqt,
                           dk_acc[..., c:d, :], dv_acc[..., c:d, :], buf, i == 0, G)
        if end == 0:
            dqt[...] = 0                                                # no key: no gradient
        dqt *= scale                                                    # dQ = scale · dS K
        if buf.dq_up is not None:
            np.copyto(dq[..., a:b, :], dqt, casting="same_kind")
    if buf.dq_up is not None:                                           # rounded once
        np.copyto(dk, dk_acc, casting="same_kind")
        np.copyto(dv, dv_acc, casting="same_kind")


def _tile_backward(E, mt, Dt, qs, dys, kt, vt, dqt, dk_c, dv_c, buf, first, G):
    """One query tile a against one key tile c, ``E`` holding their scores S on entry:
    E = exp(S − m) = ℓ P,  dV_c += Eᵀ (dY/ℓ),  dS/scale = E ⊙ ((dY/ℓ) Vᵀ − D/ℓ) = P ⊙ (dP − D),
    dQ_a/scale += dS K_c,  dK_c += dSᵀ (scale·Q_a), each in place."""
    nq, nk = E.shape[-2:]
    E -= mt
    np.exp(E, out=E)                                                    # E = exp(S − m) = ℓ P
    dv_c += _matmul_sum(E.swapaxes(-1, -2), dys, buf.dv[..., :nk, :], G)   # dV_c += Pᵀ dY_a
    dS = np.matmul(dys, vt.swapaxes(-1, -2), out=buf.dP[..., :nq, :nk])    # dP/ℓ
    dS -= Dt
    dS *= E                                                             # dS/scale = P ⊙ (dP − D)
    if first:
        np.matmul(dS, kt, out=dqt)
    else:
        dqt += np.matmul(dS, kt, out=buf.dq[..., :nq, :])               # dQ_a/scale += dS K_c
    dk_c += _matmul_sum(dS.swapaxes(-1, -2), qs, buf.dk[..., :nk, :], G)   # dK_c += dSᵀ (scale·Q_a)


class _BackwardBuffers(NamedTuple):
    """One thread's scratch for the backward pass: a tile of E = exp(S − m) and of dP/ℓ (then
    dS/scale), of scale·Q, dY/ℓ and a product into dQ, of the key tile's dK and dV, and float32
    copies of a key and value tile and of a query tile's dQ (float16/bfloat16 input; else None)."""
    E: np.ndarray
    dP: np.ndarray
    qs: np.ndarray
    dys: np.ndarray
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    k: object
    v: object
    dq_up: object


def _backward_buffers(q, k, v, dk, bq, bk, cd):
    """The ``_BackwardBuffers`` for tiles of ``bq`` queries and ``bk`` keys of these sequences."""
    lead, kv_lead = q.shape[:-2], dk.shape[:-2]                         # (n, ..., ·), (n, ..., H_kv)
    k_up, v_up, dq_up = _upcast_buffers(q.dtype, cd, k.shape[:-2], lead, bq, bk,
                                        k.shape[-1], v.shape[-1], q.shape[-1])
    return _BackwardBuffers(np.empty((*lead, bq, bk), cd), np.empty((*lead, bq, bk), cd),
                            np.empty((*lead, bq, q.shape[-1]), cd),
                            np.empty((*lead, bq, v.shape[-1]), cd),
                            np.empty((*lead, bq, q.shape[-1]), cd),
                            np.empty((*kv_lead, bk, k.shape[-1]), cd),
                            np.empty((*kv_lead, bk, v.shape[-1]), cd), k_up, v_up, dq_up)


def _accumulators(dk, dv, cd, upcast):
    """dK and dV sum over query tiles: zeroed ``dk, dv`` themselves, or (float16/bfloat16,
    ``upcast``) zeroed float32 arrays, rounded into them at the end."""
    dk_acc = dk if not upcast else np.empty(dk.shape, cd)
    dv_acc = dv if not upcast else np.empty(dv.shape, cd)
    dk_acc[...] = 0
    dv_acc[...] = 0
    return dk_acc, dv_acc


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
    to the scores' shape as a view, or None). The arguments were checked by ``tformer.nn.functional``."""
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


def _part(arrays, lo, hi):
    """Items ``lo:hi`` of the first axis of every array (views; None passes through)."""
    return tuple(None if a is None else a[lo:hi] for a in arrays)


def _ranges(n, size):
    """``[(0, size), (size, 2·size), …]`` covering [0, n); the last range may be shorter."""
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def _key_end(a, b, T_q, T_k, is_causal):
    """The keys [0, end) that query tile [a, b) may see: all T_k, or with ``is_causal`` those up to
    the tile's last query, b − 1 + (T_k − T_q). Key tiles beyond are never computed."""
    return min(T_k, b + T_k - T_q) if is_causal else T_k
