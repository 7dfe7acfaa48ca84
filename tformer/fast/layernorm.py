"""LayerNorm, faster: y = γ ⊙ (x − μ)·rstd + β over the last axis, and its compact backward.

Equal to ``tformer.kernels.layernorm`` (``tests/kernels/test_fast_layernorm.py``). Faster because the
rows are split across threads (``parallel.parallel_for``), every step writes into the output (or
a per-thread ``scratch`` buffer) instead of a new array, the row means are one BLAS
matrix-vector product with (1/C, ..., 1/C), and dγ, dβ run as two tasks side by side
(``parallel.run_tasks``). float16/bfloat16: statistics and normalisation in float32.
"""
import numpy as np

from tformer.core import parallel
from tformer.core.dtypes import is_low
from tformer.kernels.layernorm import LayerNormCache


def layernorm_forward(x, gamma, beta, eps=1e-5):
    """y = γ ⊙ x̂ + β, x̂ = (x − μ)·rstd: ``kernels.layernorm.layernorm_forward``, rows split across threads.

    Shapes: ``x: (..., C)``, ``gamma, beta: (C,)``  ->  ``y: (..., C)``.
    float16/bfloat16: the statistics and the normalisation run in float32 on upcast copies and y is
    rounded back (a variance summed in 11 bits is too coarse); ``mu`` and ``rstd`` stay float32.
    Returns ``y, cache``.
    """
    C = x.shape[-1]
    if is_low(x.dtype):
        y, (_, _, mu, rstd) = layernorm_forward(*(a.astype(np.float32) for a in (x, gamma, beta)), eps)
        return y.astype(x.dtype), LayerNormCache(x, gamma, mu, rstd)
    x2 = x.reshape(-1, C)                                # (N, C)
    N = x2.shape[0]
    y = np.empty_like(x2)
    mu, rstd = np.empty((N, 1), x.dtype), np.empty((N, 1), x.dtype)
    ones_C = np.full(C, 1.0 / C, x.dtype)

    parallel.parallel_for(lambda lo, hi: _rows(x2[lo:hi], gamma, beta, eps, ones_C, y[lo:hi],
                                               mu[lo:hi], rstd[lo:hi]),
                          N, grain=parallel.grain_for(C))
    lead = x.shape[:-1]
    return y.reshape(x.shape), LayerNormCache(x, gamma, mu.reshape(*lead, 1), rstd.reshape(*lead, 1))


def _rows(x, gamma, beta, eps, ones_C, y, m, r):
    """y = γ ⊙ (x − μ)·rstd + β for a block of rows ``x: (n, C)``, written into ``y: (n, C)``, with
    μ and rstd into ``m, r: (n, 1)``; ``ones_C = (1/C, …, 1/C)``."""
    # Row means as one matrix-vector product with (1/C, ..., 1/C): BLAS reduces rows of a few
    # hundred floats several times faster than x.mean(axis=-1); sums of squares are np.vecdot.
    np.matmul(x, ones_C, out=m[:, 0])                  # μ
    np.subtract(x, m, out=y)                           # x − μ
    np.vecdot(y, y, out=r[:, 0])
    r /= x.shape[1]
    r += eps
    np.sqrt(r, out=r)
    np.reciprocal(r, out=r)                            # rstd = 1/√(var + ε)
    y *= r                                             # x̂
    y *= gamma
    y += beta                                          # y = γ ⊙ x̂ + β, in the same buffer


def layernorm_backward(dy, cache):
    """dx = rstd ⊙ (g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)), g = γ ⊙ dy; dγ = Σ dy ⊙ x̂; dβ = Σ dy:
    ``kernels.layernorm.layernorm_backward``, rows split across threads, x̂ in a scratch buffer.

    Shapes: ``dy: (..., C)`` -> ``(dx: (..., C), dgamma: (C,), dbeta: (C,))``. float16/bfloat16:
    computed in float32, the three gradients rounded back to the input's format.
    """
    x, gamma, mu, rstd = cache
    if is_low(x.dtype):
        cache32 = LayerNormCache(x.astype(np.float32), gamma.astype(np.float32), mu, rstd)
        return tuple(g.astype(x.dtype) for g in layernorm_backward(dy.astype(np.float32), cache32))
    C = x.shape[-1]
    x2, dy2 = x.reshape(-1, C), dy.reshape(-1, C)        # (N, C)
    mu2, rstd2 = mu.reshape(-1, 1), rstd.reshape(-1, 1)  # (N, 1)
    N = x2.shape[0]
    xhat, dx = parallel.scratch("layernorm_xhat", x2.shape, x2.dtype), np.empty_like(x2)
    ones_C = np.full(C, 1.0 / C, x.dtype)

    parallel.parallel_for(lambda lo, hi: _dx_rows(x2[lo:hi], dy2[lo:hi], mu2[lo:hi], rstd2[lo:hi], gamma,
                                                  ones_C, xhat[lo:hi], dx[lo:hi]),
                          N, grain=parallel.grain_for(C))
    # dγ and dβ sum over all N rows: each is one whole reduction (never split into partial sums).
    dgamma, dbeta = parallel.run_tasks(
        lambda: np.einsum("nc,nc->c", dy2, xhat),
        lambda: np.ones(N, dy.dtype) @ dy2)              # Σ over rows as one vector-matrix product
    return dx.reshape(x.shape), dgamma, dbeta


def _dx_rows(x, dy, mu, r, gamma, ones_C, xh, g):
    """One block of rows: ``xh`` ← x̂ (recomputed, not stored), ``g`` ← dx = r (g − mean(g) − x̂ mean(g x̂))."""
    np.subtract(x, mu, out=xh)
    xh *= r                                                # x̂
    np.multiply(dy, gamma, out=g)                          # g = γ ⊙ dy
    mean_g = (g @ ones_C)[:, None]                         # (rows, 1)
    mean_gx = np.vecdot(g, xh)[:, None]
    mean_gx /= x.shape[1]
    g -= mean_g
    g -= np.multiply(xh, mean_gx, out=parallel.scratch("layernorm_t", xh.shape, xh.dtype))
    g *= r                                                 # dx, written over g
