"""The row functions of one decoding step: one new position a sequence, in few NumPy calls.

Generating one token for ``B`` sequences works on rows of ``C`` numbers: every product
is a matrix-vector product, and the fixed cost of each call (argument checks, views,
closures, the thread pool's bookkeeping) outweighs the arithmetic. So a layer handed a KV
cache and one new position a sequence computes through its row path (``LayerNorm.rows``,
``Linear.rows``, ``FeedForward.rows``, ``MultiHeadAttention.rows``, ``PreNormBlock.rows``;
the chapter "Performance" counts the calls of both paths with cProfile), and the row
functions here are what those paths call: the same NumPy calls on the same arrays, in the
same order, and little else, through the same row functions as the kernels
(``fast.layernorm``, ``fast.linear``, ``fast.activations``, ``fast.softmax``) and the
cache's own ``append``.

The results are those of ``layernorm_forward``, ``linear_forward``, ``attention_forward``
(one query, no mask) and ``gelu_forward`` (tanh), bit for bit (``tests/decoding/test_decode.py``):
each kernel's row function runs on arrays of the same shapes and strides. A row path is
taken only where no kernel would split its work across threads (``no_split``), so the
general path computes every result whole as well.
"""
import functools

import numpy as np

from tformer.core import parallel
from tformer.fast.activations import _gelu_tanh_rows
from tformer.fast.layernorm import _rows as _ln_rows
from tformer.fast.linear import _MIN_MACS, forward_rows as _linear_rows
from tformer.fast._grouped_heads import _split_axis
from tformer.fast.softmax import _exp_rows, _softmax_inplace

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))   # float16/bfloat16: general path


_UNSPLIT = {}       # (B, C, d_ff, H, MIN_PART) -> no_split's answer with threads: asked by every layer


def no_split(B, C, d_ff, H):
    """True when the general kernels run a one-token step of ``B`` rows unsplit: the
    largest product (``B × C × d_ff`` multiply-adds) below two parts of
    ``fast.linear._MIN_MACS``, attention's ``B`` sequences below its grain, and elementwise
    work below two ``parallel.MIN_PART``."""
    if parallel.get_num_threads() == 1:
        return True
    key = (B, C, d_ff, H, parallel.MIN_PART)
    unsplit = _UNSPLIT.get(key)
    if unsplit is None:
        items, grain = _split_axis(np.empty((B, H, 1, C // H), np.float32))
        unsplit = _UNSPLIT[key] = (B * C * d_ff < 2 * _MIN_MACS and items < 2 * grain
                                   and B * d_ff < 2 * parallel.MIN_PART)
    return unsplit


@functools.cache
def mean_weights(C, dtype):
    """(1/C, …, 1/C): the vector whose product with a row is its mean (``fast.layernorm``'s),
    made once per width and format and shared (read-only) by every step."""
    w = np.full(C, 1.0 / C, dtype)
    w.flags.writeable = False
    return w


@functools.cache
def ones(n, dtype):
    """(1, …, 1), ``n`` of them, made once per length and format and shared (read-only): a
    row of scores times ``ones`` is its sum (``fast.softmax``'s)."""
    w = np.ones(n, dtype)
    w.flags.writeable = False
    return w


def layernorm_rows(x, gamma, beta, eps, ones_C=None):
    """y = γ ⊙ (x − μ)·rstd + β for ``x: (N, C)``: ``fast.layernorm``'s row function on
    unsplit rows, with ``ones_C = (1/C, …, 1/C)`` (default ``mean_weights``). Returns y, a
    new (N, C) array."""
    N, C = x.shape
    y = np.empty_like(x)
    stats = np.empty((2, N, 1), x.dtype)                 # μ and rstd, (N, 1) each
    _ln_rows(x, gamma, beta, eps, mean_weights(C, x.dtype) if ones_C is None else ones_C,
             y, stats[0], stats[1])
    return y


def linear_rows(x, W, b):
    """Y = X W + b for ``x: (N, C_in)``: ``fast.linear``'s row function on unsplit rows (new Y)."""
    y = np.empty((x.shape[0], W.shape[1]), W.dtype)
    _linear_rows(x, W, b, y)
    return y


def gelu_rows(h):
    """GELU (tanh form) of ``h``, in place: ``fast.activations``' row function, y = x σ(2u).
    The caller holds ``np.errstate(over="ignore", under="ignore")``."""
    _gelu_tanh_rows(h, np.empty_like(h), h)
    return h


def attention_one(qkv, cache, H, scale, ones_L):
    """softmax(q Kᵀ · scale) V for one new query a sequence, after appending its k and v.

    ``qkv: (B, 1, 3C)`` (the fused projection of the new positions), ``cache``: the
    block's ``KVCache`` (t positions before, t + 1 after). Returns the heads merged,
    ``(B, 1, C)``, and the probabilities ``(B, H, 1, t + 1)``. The scaling of q, the
    products and the softmax (``fast.softmax``'s) are ``attention_forward``'s, on the
    arrays that ``MultiHeadAttention.forward`` passes it (q is scaled into a new array and
    k, v are copied into the cache, so their views' strides do not enter the results).
    """
    B, _, C3 = qkv.shape
    C = C3 // 3
    D = C // H
    heads = qkv.reshape(B, 3, H, 1, D)                   # [:, i]: q, k, v as (B, H, 1, D) views
    K, V = cache.append(heads[:, 1], heads[:, 2])        # (B, H, t + 1, D)
    T_k = K.shape[2]
    S = np.empty((B, H, 1, T_k), qkv.dtype)
    np.matmul(np.multiply(heads[:, 0], scale, dtype=qkv.dtype), K.swapaxes(-1, -2), out=S)
    m = np.maximum.reduce(S, axis=-1, keepdims=True)     # the row maxima, as S.max(axis=-1)
    if np.logical_and.reduce(np.isfinite(m), axis=None):  # the common case, without the checks
        S /= _exp_rows(S, m, ones_L[:T_k])
    else:                            # NaN or ±inf scores: the kernel's checks and rules
        _softmax_inplace(S)
    merged = np.empty((B, 1, C), qkv.dtype)
    np.matmul(S, V, out=merged.reshape(B, 1, H, D).transpose(0, 2, 1, 3))
    return merged, S
