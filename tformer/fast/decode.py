"""One decoding step of TinyGPT's pre-norm block in few NumPy calls, same arithmetic.

Generating one token for ``B`` sequences works on rows of ``C`` numbers: every product
is a matrix-vector product, and the fixed cost of each call (argument checks, views,
closures, the thread pool's bookkeeping) outweighs the arithmetic. A step through the
general layers makes several times the function calls of these (the chapter "Performance"
counts both with cProfile), which make the same NumPy calls on the same arrays, in the same
order, and little else, through
the same row functions as the kernels (``fast.layernorm``, ``fast.linear``,
``fast.activations``, ``fast.softmax``) and the cache's own ``append``:

    X ← X + Attn(LN₁(X)),  X ← X + MLP(LN₂(X))       X: (B, C), one new position a row

with the new keys and values written into the block's ``KVCache``. The results are
those of ``layernorm_forward``, ``linear_forward``, ``attention_forward`` (one query, no
mask), ``gelu_forward`` (tanh) and the residual sums, bit for bit
(``tests/test_decode.py``): each kernel's row function runs on arrays of the same shapes
and strides. It is used only where no kernel would split its work
across threads (``no_split``), so the general path computes every result whole as well.
"""
import math

import numpy as np

from tformer.core import parallel
from tformer.fast.activations import _gelu_tanh_rows
from tformer.fast.layernorm import _rows as _ln_rows
from tformer.fast.linear import _MIN_MACS, forward_rows as _linear_rows
from tformer.fast._grouped_heads import _split_axis
from tformer.fast.softmax import _exp_rows, _softmax_inplace

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))   # float16/bfloat16: general path


def no_split(B, C, d_ff, H):
    """True when the general kernels run a one-token step of ``B`` rows unsplit: the
    largest product (``B × C × d_ff`` multiply-adds) below two parts of
    ``fast.linear._MIN_MACS``, attention's ``B`` sequences below its grain, and elementwise
    work below two ``parallel.MIN_PART``."""
    if parallel.get_num_threads() == 1:
        return True
    items, grain = _split_axis(np.empty((B, H, 1, C // H), np.float32))
    return (B * C * d_ff < 2 * _MIN_MACS and items < 2 * grain
            and B * d_ff < 2 * parallel.MIN_PART)


def layernorm_rows(x, gamma, beta, eps, ones_C):
    """y = γ ⊙ (x − μ)·rstd + β for ``x: (N, C)``: ``fast.layernorm``'s row function on
    unsplit rows, with ``ones_C = (1/C, …, 1/C)``. Returns y, a new (N, C) array."""
    N = x.shape[0]
    y = np.empty_like(x)
    _ln_rows(x, gamma, beta, eps, ones_C, y, np.empty((N, 1), x.dtype), np.empty((N, 1), x.dtype))
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
    ``(B, 1, C)``, and the probabilities ``(B, H, 1, t + 1)``. The views, the scaling of
    q, the products and the softmax (``fast.softmax``'s) are ``attention_forward``'s, on
    the arrays that ``MultiHeadAttention.forward`` passes it.
    """
    B, _, C3 = qkv.shape
    C = C3 // 3
    D = C // H
    q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, 1, H, D).transpose(0, 2, 1, 3)
               for i in range(3))                        # (B, H, 1, D) views
    K, V = cache.append(k, v)                            # (B, H, t + 1, D)
    T_k = K.shape[2]
    S = np.empty((B, H, 1, T_k), qkv.dtype)
    np.matmul(np.multiply(q, scale, dtype=qkv.dtype), K.swapaxes(-1, -2), out=S)
    m = S.max(axis=-1, keepdims=True)
    if np.isfinite(m).all():                             # the common case, without the checks
        S /= _exp_rows(S, m, ones_L[:T_k])
    else:                            # NaN or ±inf scores: the kernel's checks and rules
        _softmax_inplace(S)
    merged = np.empty((B, 1, C), qkv.dtype)
    np.matmul(S, V, out=merged.reshape(B, 1, H, D).transpose(0, 2, 1, 3))
    return merged, S


def block_step(x, blk, cache, ones_C, ones_L):
    """One pre-norm block on the new positions ``x: (B, C)`` -> ``(B, C)``; fills
    ``cache``. ``blk`` is a ``PreNormBlock`` with LayerNorm, a fused W_qkv, multi-head
    attention (H_kv = H), no RoPE, the plain kernel and a GELU (tanh) MLP. Every linear
    map computes through its own layer's ``rows`` (a float, int8 or LoRA layer, each with
    its own arithmetic); the norms' parameters are read as they are now.
    """
    attn, ffn = blk.attn, blk.ffn
    B, C = x.shape
    a = layernorm_rows(x, blk.ln1.gamma, blk.ln1.beta, blk.ln1.eps, ones_C)
    qkv = attn.qkv.rows(a).reshape(B, 1, 3 * C)
    H = attn.n_heads
    scale = 1.0 / math.sqrt(C // H) if attn.scale is None else float(attn.scale)
    merged, P = attention_one(qkv, cache, H, scale, ones_L)
    attn.keep(att=P)                                     # P, as its forward keeps it; no backward
    h = attn.o.rows(merged.reshape(B, C))
    h += x                                               # X + MHA(LN(X))
    a = layernorm_rows(h, blk.ln2.gamma, blk.ln2.beta, blk.ln2.eps, ones_C)
    f = gelu_rows(ffn.fc1.rows(a))
    out = ffn.fc2.rows(f)
    out += h                                             # X + FFN(LN(X))
    return out
