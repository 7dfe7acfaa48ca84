"""Scaled dot-product attention kernel (multi-head and grouped-query), its masks, and the head split/merge reshapes."""
import math

import numpy as np

from .. import parallel
from .._dtypes import compute_dtype, matmul
from .._validate import float_array, int_array, same_dtype
from .softmax import _softmax_backward_inplace, _softmax_inplace, _softmax_shifted_inplace


def causal_mask(T_q, T_k=None):
    """M[i, j] = (j ≤ i + T_k − T_q): query i sees keys up to its own position.

    Shapes: -> ``(T_q, T_k)`` boolean, True where attention is allowed. With ``T_k > T_q`` (a KV cache
    holding ``T_k − T_q`` earlier positions) the queries are the last ``T_q`` positions.
    """
    T_k = T_q if T_k is None else T_k
    if T_k < T_q:
        raise ValueError(f"T_k: expected at least T_q = {T_q} keys, got {T_k}")
    return np.tril(np.ones((T_q, T_k), dtype=bool), k=T_k - T_q)


def padding_mask(tokens, pad_idx=0):
    """M[b, 0, 0, j] = (tokens[b, j] ≠ pad_idx): no query attends to a padding key.

    Shapes: ``tokens: (B, T)`` -> ``(B, 1, 1, T)`` boolean, broadcasting over heads and queries
    (the guide's ``create_padding_mask``).
    """
    int_array("tokens", tokens, ndim=2)
    return (tokens != pad_idx)[:, None, None, :]


create_padding_mask = padding_mask


def split_heads(x, n_heads):
    """(B, T, C) -> (B, H, T, D), D = C / H: head h owns channels [h·D, (h+1)·D). A reshape, no arithmetic."""
    float_array("x", x, ndim=3)
    B, T, C = x.shape
    if n_heads < 1 or C % n_heads:
        raise ValueError(f"n_heads: must divide C = {C}, got {n_heads}")
    return x.reshape(B, T, n_heads, C // n_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, H, T, D) -> (B, T, H·D): the inverse of ``split_heads``, and also its gradient (and vice versa)."""
    float_array("x", x, ndim=4)
    B, H, T, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def attention_forward(q, k, v, mask=None, scale=None, is_causal=False, out=None):
    """Y = softmax(S) V,  S = scale · Q Kᵀ + M,  scale = 1/√D unless given.

    Shapes: ``q: (..., T_q, D)``, ``k: (..., T_k, D)``, ``v: (..., T_k, D_v)`` with the same leading
    axes (typically ``(B, H)``)  ->  ``y: (..., T_q, D_v)``.
    Grouped-query attention: ``q: (..., H, T_q, D)`` with ``k, v: (..., H_kv, T_k, ·)``, H a multiple
    of H_kv; query head h uses key/value head ⌊h / G⌋, G = H / H_kv (consecutive query heads share
    one; G = H is multi-query attention). K and V are never repeated: Q is viewed as
    ``(..., H_kv, G, T_q, D)`` (splitting an axis is a view, even of a strided array) and K, V as
    ``(..., H_kv, 1, T_k, ·)``, so each product broadcasts one key/value head over its G query
    heads by a zero stride, one BLAS call per query head as without groups. See ``_grouped``.
    ``mask`` broadcasts to ``(..., T_q, T_k)``: boolean (True = may attend; False sets the score
    to −inf) or additive float (added to S; use −inf, not a finite "large" value, which leaks
    probability when scores are of that size). A query whose keys are all masked gets a zero
    attention row, hence a zero output and zero gradients, never NaN.
    ``is_causal=True`` (with ``mask=None`` and T_q = T_k) applies the causal mask without building
    it and skips the work it would throw away: the queries are taken in tiles of ``_TILE`` = 64
    rows, and a tile's scores, softmax and products use only the keys up to its last query (the
    tiles above the diagonal are all −inf, so P is 0 there and is written as 0). With n tiles that
    is (n + 1)/2n of the products and exponentials (5/8 at T = 256). Same result as
    ``mask=causal_mask(T)``.
    ``out``: an array (or a view, e.g. the heads of a ``(B, T, C)`` buffer) to write y into.
    float16/bfloat16: each product accumulates in float32 and the softmax runs in float32
    (``tformer._dtypes.matmul``, ``softmax``); S, P and y are stored in the input's format.
    Returns ``y, cache`` with the probabilities ``P: (..., T_q, T_k)`` in the cache.
    """
    G = check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if is_causal:
        if mask is not None:
            raise ValueError("mask: must be None when is_causal=True (combine the masks instead)")
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(f"is_causal: needs T_q = T_k, got q {q.shape} and k {k.shape}")
        if q.ndim >= 3:
            return _causal_forward(q, k, v, scale, _out("out", out, (*q.shape[:-1], v.shape[-1]), q.dtype), G)
        mask = causal_mask(q.shape[-2])                  # a single (T, D) sequence: the plain path
    S = np.empty((*q.shape[:-1], k.shape[-2]), q.dtype)  # (..., T_q, T_k): scores, then P in place
    blocked, additive = None, None
    if mask is not None:
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"mask: expected a boolean or float NumPy array, got {type(mask).__name__}")
        try:
            np.broadcast_shapes(mask.shape, S.shape)
        except ValueError:
            raise ValueError(f"mask: shape {mask.shape} does not broadcast to scores {S.shape}") from None
        if mask.dtype == bool:
            blocked = ~mask
        elif np.issubdtype(mask.dtype, np.floating):
            additive = mask.astype(S.dtype, copy=False)
        else:
            raise TypeError(f"mask: expected dtype bool or float, got {mask.dtype}")
    y = _out("out", out, (*q.shape[:-1], v.shape[-1]), q.dtype)   # (..., T_q, D_v)
    if G > 1:                      # the mask, broadcast to S's shape (a view), grouped like S
        blocked, additive = (None if m is None else np.broadcast_to(m, S.shape) for m in (blocked, additive))
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
    return y, (q, k, v, S, scale, None)


_TILE = 64
_SHIFTED = (np.dtype(np.float32), np.dtype(np.float64))   # causal softmax shifted by s_ii


def check_qkv(q, k, v):
    """The attention inputs checked once, for the plain and the online-softmax kernels: float arrays
    of one dtype and one rank ≥ 2, D_q = D_k, T_k = T_v, leading axes that agree (but for the head
    axis of grouped-query attention). Returns G = H / H_kv (``_group_size``)."""
    float_array("q", q, min_ndim=2)
    float_array("k", k, min_ndim=2)
    float_array("v", v, min_ndim=2)
    same_dtype(q=q, k=k, v=v)
    if not (q.ndim == k.ndim == v.ndim):
        raise ValueError(f"q, k, v: expected the same rank, got {q.shape}, {k.shape}, {v.shape}")
    G = _group_size(q, k, v)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k: expected key size D = {q.shape[-1]} (from q), got shape {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"v: expected {k.shape[-2]} positions (from k), got shape {v.shape}")
    return G


def _group_size(q, k, v):
    """G = H / H_kv, the query heads per key/value head (1 when q, k, v have the same leading axes).

    Checks that the leading axes agree except, for grouped-query attention, the head axis −3."""
    if k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"k, v: leading axes differ: {k.shape}, {v.shape}")
    if q.shape[:-2] == k.shape[:-2]:
        return 1
    if q.ndim < 3 or q.shape[:-3] != k.shape[:-3]:
        raise ValueError(f"q, k, v: leading axes differ: {q.shape}, {k.shape}, {v.shape} (only the "
                         "head axis −3 may differ, for grouped-query attention)")
    H, H_kv = q.shape[-3], k.shape[-3]
    if H_kv < 1 or H % H_kv:
        raise ValueError(f"k: grouped-query attention needs H = {H} query heads to be a multiple of "
                         f"the key/value heads H_kv, got H_kv = {H_kv} (q {q.shape}, k {k.shape})")
    return H // H_kv


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


def _out(name, out, shape, dtype):
    """``out`` checked against the shape and dtype it must have, or a new array."""
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray) or out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"{name}: expected a {np.dtype(dtype)} array of shape {tuple(shape)}, got "
                         f"{getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}")
    return out


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
    return y, (q, k, v, S, scale, tiles)


def _scaled(q, scale):
    """scale · Q, a new array in Q's format (float16/bfloat16: multiplied in float32, rounded once)."""
    return np.multiply(q, scale, dtype=compute_dtype(q.dtype)).astype(q.dtype, copy=False)


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


def attention_backward(dy, cache, out=None):
    """dV = Pᵀ dY,  dP = dY Vᵀ,  dS = P ⊙ (dP − rowsum(dP ⊙ P)),  dQ = scale · dS K,  dK = scale · dSᵀ Q.

    In the forward pass Y = P V, so V's gradient is Pᵀ dY and P's is dY Vᵀ; the softmax VJP turns
    dP into dS; S = scale · Q Kᵀ gives the last two lines. A masked entry has P = 0, so its dS is
    exactly 0: the mask blocks the gradient just as it blocked the forward pass.
    Grouped-query attention: key/value head j served the G query heads (j, 0 … G−1), so
    dK_j = scale · Σ_g dS_(j,g)ᵀ Q_(j,g) and dV_j = Σ_g P_(j,g)ᵀ dY_(j,g) (``_matmul_sum``).
    Shapes: ``dy: (..., T_q, D_v)`` -> ``(dq, dk, dv)`` shaped like ``q, k, v``.
    ``out=(dq, dk, dv)``: arrays (or views, e.g. into one fused ``(B, T, 3C)`` gradient) to write
    the three gradients into, instead of new arrays; they are returned.
    """
    q, k, v, P, scale, tiles = cache
    if dy.shape != (*q.shape[:-1], v.shape[-1]):
        raise ValueError(f"dy: expected shape {(*q.shape[:-1], v.shape[-1])}, got {dy.shape}")
    if out is not None and len(out) != 3:
        raise ValueError(f"out: expected three arrays (dq, dk, dv), got {len(out)}")
    out = tuple(_out(f"out[{i}] (d{n})", None if out is None else out[i], like.shape, like.dtype)
                for i, (n, like) in enumerate(zip("qkv", (q, k, v))))
    G = _group_size(q, k, v)
    if tiles is not None:
        return _causal_backward(dy, q, k, v, P, scale, tiles, out, G)
    dq, dk, dv = out
    qg, kg, vg, Pg, dyg, dqg = _grouped(G, q, k, v, P, dy, dq)

    def seqs(lo, hi):
        at = _items(lo, hi, qg.ndim)
        Pp, dyp = Pg[at], dyg[at]
        _matmul_sum(Pp.swapaxes(-1, -2), dyp, dv[at], G)        # dV = Pᵀ dY   (..., T_k, D_v)
        dS = _softmax_backward_inplace(matmul(dyp, vg[at].swapaxes(-1, -2)), Pp)   # dS/scale, over dP
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
            _softmax_backward_inplace(dSt, St)           # dS/scale = P ⊙ (dP − ⟨dP, P⟩), in place
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
