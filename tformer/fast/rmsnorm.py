"""RMSNorm, faster: y = γ ⊙ x · rstd, rstd = 1/√(mean(x²) + ε) over the last axis, and its backward.

Equal to ``tformer.kernels.rmsnorm`` (``tests/kernels/test_fast_modern.py``). Faster because the rows are
split across threads (``parallel.parallel_for``), the sums of squares are ``np.vecdot`` and every
step writes into the output (or a per-thread ``scratch`` buffer) instead of a new array.
float16/bfloat16: computed in float32 on upcast copies, as LayerNorm.
"""
import numpy as np

from tformer.core import parallel
from tformer.core.dtypes import is_low
from tformer.kernels.rmsnorm import RMSNormCache


def rmsnorm_forward(x, gamma, eps=1e-6):
    """y = γ ⊙ x̂, x̂ = x · rstd: ``kernels.rmsnorm.rmsnorm_forward``, rows split across threads.

    Shapes: ``x: (..., C)``, ``gamma: (C,)``  ->  ``y: (..., C)``. float16/bfloat16: computed in
    float32 on upcast copies, y rounded back, ``rstd`` kept in float32. Returns ``y, cache``.
    """
    C = x.shape[-1]
    if is_low(x.dtype):
        y, (_, _, rstd) = rmsnorm_forward(x.astype(np.float32), gamma.astype(np.float32), eps)
        return y.astype(x.dtype), RMSNormCache(x, gamma, rstd)
    x2 = x.reshape(-1, C)                                # (N, C)
    N = x2.shape[0]
    y = np.empty_like(x2)
    rstd = np.empty((N, 1), x.dtype)

    def rows(lo, hi):
        r = rstd[lo:hi]
        np.vecdot(x2[lo:hi], x2[lo:hi], out=r[:, 0])       # Σ x²
        r /= C
        r += eps
        np.sqrt(r, out=r)
        np.reciprocal(r, out=r)                            # rstd = 1/√(mean(x²) + ε)
        np.multiply(x2[lo:hi], r, out=y[lo:hi])            # x̂
        y[lo:hi] *= gamma                                  # y = γ ⊙ x̂, in the same buffer

    parallel.parallel_for(rows, N, grain=parallel.grain_for(C))
    return y.reshape(x.shape), RMSNormCache(x, gamma, rstd.reshape(*x.shape[:-1], 1))


def rmsnorm_backward(dy, cache):
    """dx = rstd ⊙ (g − x̂ ⊙ mean(g ⊙ x̂)), g = γ ⊙ dy; dγ = Σ dy ⊙ x̂:
    ``kernels.rmsnorm.rmsnorm_backward``, rows split across threads, x̂ in a scratch buffer.

    Shapes: ``dy: (..., C)`` -> ``(dx: (..., C), dgamma: (C,))``. float16/bfloat16: in float32,
    both gradients rounded back to the input's format.
    """
    x, gamma, rstd = cache
    if is_low(x.dtype):
        cache32 = RMSNormCache(x.astype(np.float32), gamma.astype(np.float32), rstd)
        return tuple(g.astype(x.dtype) for g in rmsnorm_backward(dy.astype(np.float32), cache32))
    C = x.shape[-1]
    x2, dy2 = x.reshape(-1, C), dy.reshape(-1, C)        # (N, C)
    rstd2 = rstd.reshape(-1, 1)                          # (N, 1)
    N = x2.shape[0]
    xhat, dx = parallel.scratch("rmsnorm_xhat", x2.shape, x2.dtype), np.empty_like(x2)

    def rows(lo, hi):
        xh, g, r = xhat[lo:hi], dx[lo:hi], rstd2[lo:hi]
        np.multiply(x2[lo:hi], r, out=xh)                  # x̂, recomputed, not stored
        np.multiply(dy2[lo:hi], gamma, out=g)              # g = γ ⊙ dy
        mean_gx = np.vecdot(g, xh)[:, None]
        mean_gx /= C                                       # mean(g ⊙ x̂), (rows, 1)
        g -= np.multiply(xh, mean_gx, out=parallel.scratch("rmsnorm_t", xh.shape, xh.dtype))
        g *= r                                             # dx, written over g

    parallel.parallel_for(rows, N, grain=parallel.grain_for(C))
    dgamma = np.einsum("nc,nc->c", dy2, xhat)              # Σ over all N rows, one reduction
    return dx.reshape(x.shape), dgamma
