"""RMS normalisation kernel over the last axis (LayerNorm without the mean), and its backward."""
import numpy as np

from .. import parallel
from .._dtypes import is_low
from .._validate import float_array, same_dtype


def rmsnorm_forward(x, gamma, eps=1e-6):
    """y = γ ⊙ x̂,  x̂ = x · rstd,  rstd = 1/√(mean(x²) + ε)  (over the last axis).

    Shapes: ``x: (..., C)``, ``gamma: (C,)``  ->  ``y: (..., C)``.
    LayerNorm without the two things that make it shift-invariant: no mean is subtracted and no β
    is added. A zero row gives y = 0, finite because ε > 0. As in ``layernorm_forward``, the cache
    keeps only the per-row ``rstd`` (plus ``x``, which the caller holds anyway); the backward
    recomputes x̂. float16/bfloat16: computed in float32 on upcast copies (as LayerNorm), y rounded
    back, ``rstd`` kept in float32. Returns ``y, cache``.
    """
    float_array("x", x, min_ndim=1)
    C = x.shape[-1]
    float_array("gamma", gamma, ndim=1)
    if gamma.shape != (C,):
        raise ValueError(f"gamma: expected shape ({C},), got {gamma.shape}")
    same_dtype(x=x, gamma=gamma)
    if not eps > 0:
        raise ValueError(f"eps: expected a positive number, got {eps}")
    if is_low(x.dtype):
        y, (_, _, rstd) = rmsnorm_forward(x.astype(np.float32), gamma.astype(np.float32), eps)
        return y.astype(x.dtype), (x, gamma, rstd)
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
    return y.reshape(x.shape), (x, gamma, rstd.reshape(*x.shape[:-1], 1))


def rmsnorm_backward(dy, cache):
    """dx = rstd ⊙ (g − x̂ ⊙ mean(g ⊙ x̂)),  g = γ ⊙ dy;  dγ = Σ dy ⊙ x̂.

    In the forward pass every x̂_i depends on the whole row through rstd alone, so the Jacobian is
    ∂x̂_i/∂x_j = rstd (δ_ij − x̂_i x̂_j / C): LayerNorm's without its −1/C term, and dx is
    LayerNorm's dx without −mean(g) (The modern block derives both). dγ sums over every row.
    Shapes: ``dy: (..., C)`` -> ``(dx: (..., C), dgamma: (C,))``. float16/bfloat16: in float32,
    both gradients rounded back to the input's format.
    """
    x, gamma, rstd = cache
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected shape {x.shape}, got {dy.shape}")
    if is_low(x.dtype):
        cache32 = (x.astype(np.float32), gamma.astype(np.float32), rstd)
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
