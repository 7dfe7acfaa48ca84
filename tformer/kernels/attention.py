"""Scaled dot-product attention, its masks and the head split/merge reshapes, as the attention
chapter derives them.

The layers call the faster version ``tformer.fast.attention`` (threads, causal tiles, grouped-query
heads, ``out=`` buffers, float16/bfloat16), through ``tformer.nn.functional``;
``tests/kernels/test_fast_attention.py`` holds it equal to this one.
"""
import math
from typing import NamedTuple

import numpy as np


def causal_mask(T_q, T_k=None):
    """M[i, j] = (j ≤ i + T_k − T_q): query i sees keys up to its own position.

    Shapes: -> ``(T_q, T_k)`` boolean, True where attention is allowed. With ``T_k > T_q`` (a KV cache
    holding ``T_k − T_q`` earlier positions) the queries are the last ``T_q`` positions.
    """
    T_k = T_q if T_k is None else T_k
    return np.tril(np.ones((T_q, T_k), dtype=bool), k=T_k - T_q)


def padding_mask(tokens, pad_idx=0):
    """M[b, 0, 0, j] = (tokens[b, j] ≠ pad_idx): no query attends to a padding key.

    Shapes: ``tokens: (B, T)`` -> ``(B, 1, 1, T)`` boolean, broadcasting over heads and queries.
    """
    return (tokens != pad_idx)[:, None, None, :]


create_padding_mask = padding_mask


def split_heads(x, n_heads):
    """(B, T, C) -> (B, H, T, D), D = C / H: head h owns channels [h·D, (h+1)·D). A reshape, no arithmetic."""
    B, T, C = x.shape
    return x.reshape(B, T, n_heads, C // n_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, H, T, D) -> (B, T, H·D): the inverse of ``split_heads``, and also its gradient (and vice versa)."""
    B, H, T, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * D)


class AttentionCache(NamedTuple):
    """What the backward pass needs from the forward pass."""
    q: np.ndarray          # Q: (..., T_q, D)
    k: np.ndarray          # K: (..., T_k, D)
    v: np.ndarray          # V: (..., T_k, D_v)
    P: np.ndarray          # P = softmax(S): (..., T_q, T_k)
    scale: float


def attention_forward(q, k, v, mask=None, scale=None):
    """Y = P V,  P = softmax(S),  S = scale · Q Kᵀ + M,  scale = 1/√D unless given.

    Shapes: ``q: (..., T_q, D)``, ``k: (..., T_k, D)``, ``v: (..., T_k, D_v)`` with the same leading
    axes (typically ``(B, H)``)  ->  ``y: (..., T_q, D_v)``. ``mask`` broadcasts to ``(..., T_q, T_k)``:
    boolean (True = may attend; False sets the score to −inf) or additive float (added to S).
    A query whose keys are all masked gets P = 0 in its row, hence y = 0, never NaN.
    Returns ``y, cache`` with the probabilities ``P: (..., T_q, T_k)`` in the cache.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    S = scale * (q @ k.swapaxes(-1, -2))                # S = scale · Q Kᵀ   (..., T_q, T_k)
    if mask is not None and mask.dtype == bool:
        S = np.where(mask, S, -np.inf)                  # + M: −inf where a key is masked
    elif mask is not None:
        S = S + mask
    m = S.max(axis=-1, keepdims=True)                   # each row's largest score
    m[np.isneginf(m)] = 0                               # a row with every key masked: exp(−inf) = 0
    E = np.exp(S - m)
    ell = E.sum(axis=-1, keepdims=True)                 # ℓ = Σ_j e^(s_j − m), 0 for such a row
    P = E / np.where(ell > 0, ell, 1)                   # P = softmax(S), row by row
    y = P @ v                                           # Y = P V   (..., T_q, D_v)
    return y, AttentionCache(q, k, v, P, scale)


def attention_backward(dy, cache):
    """dV = Pᵀ dY,  dP = dY Vᵀ,  dS = P ⊙ (dP − rowsum(dP ⊙ P)),  dQ = scale · dS K,  dK = scale · dSᵀ Q.

    In the forward pass Y = P V, so V's gradient is Pᵀ dY and P's is dY Vᵀ; the softmax VJP turns
    dP into dS; S = scale · Q Kᵀ gives the last two lines. A masked entry has P = 0, so its dS is
    exactly 0: the mask blocks the gradient just as it blocked the forward pass.
    Shapes: ``dy: (..., T_q, D_v)`` -> ``(dq, dk, dv)`` shaped like ``q, k, v``.
    """
    q, k, v, P, scale = cache
    dv = P.swapaxes(-1, -2) @ dy                        # dV = Pᵀ dY
    dP = dy @ v.swapaxes(-1, -2)                        # dP = dY Vᵀ
    dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))   # dS = P ⊙ (dP − rowsum(dP ⊙ P))
    dq = scale * (dS @ k)                               # dQ = scale · dS K
    dk = scale * (dS.swapaxes(-1, -2) @ q)              # dK = scale · dSᵀ Q
    return dq, dk, dv
