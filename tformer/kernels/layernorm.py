"""Layer normalisation kernel over the last axis, and its compact backward."""
import numpy as np

from .._validate import float_array, same_dtype


def layernorm_forward(x, gamma, beta, eps=1e-5):
    """y = γ ⊙ x̂ + β,  x̂ = (x − μ) · rstd,  μ = mean(x),  rstd = 1/√(var(x) + ε)  (over the last axis).

    Shapes: ``x: (..., C)``, ``gamma, beta: (C,)``  ->  ``y: (..., C)``.
    A constant row has var = 0: x̂ = 0 and y = β, finite because ε > 0.
    Like llm.c, the cache keeps only the small per-row ``mu`` and ``rstd`` (plus ``x``, which the
    caller holds anyway) and the backward recomputes the cheap, large x̂. Returns ``y, cache``.
    """
    float_array("x", x, min_ndim=1)
    C = x.shape[-1]
    for name, p in (("gamma", gamma), ("beta", beta)):
        float_array(name, p, ndim=1)
        if p.shape != (C,):
            raise ValueError(f"{name}: expected shape ({C},), got {p.shape}")
    same_dtype(x=x, gamma=gamma, beta=beta)
    if not eps > 0:
        raise ValueError(f"eps: expected a positive number, got {eps}")
    # Row means as one matrix-vector product with (1/C, ..., 1/C): BLAS reduces rows of a few hundred
    # floats several times faster than x.mean(axis=-1); the row sums of squares are np.vecdot.
    mu = _row_means(x)                                   # (..., 1)
    xhat = x - mu                                        # (..., C)
    var = np.vecdot(xhat, xhat)[..., None]
    var /= C
    var += eps
    rstd = np.reciprocal(np.sqrt(var, out=var), out=var)  # (..., 1)
    xhat *= rstd
    y = xhat
    y *= gamma
    y += beta
    return y, (x, gamma, mu, rstd)


def layernorm_backward(dy, cache):
    """dx = rstd ⊙ (g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)),  g = γ ⊙ dy;  dγ = Σ dy ⊙ x̂;  dβ = Σ dy.

    In the forward pass every x̂_i depends on the whole row through μ and rstd; the two means are
    what that dependence contributes (the derivation chapter shows this equals the three-term
    g_σ², g_μ form of seed 003). dγ and dβ sum over every row (all leading axes).
    Shapes: ``dy: (..., C)`` -> ``(dx: (..., C), dgamma: (C,), dbeta: (C,))``.
    """
    x, gamma, mu, rstd = cache
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected shape {x.shape}, got {dy.shape}")
    C = x.shape[-1]
    xhat = x - mu
    xhat *= rstd                                         # recomputed, not stored
    dy2 = dy.reshape(-1, C)
    dgamma = np.einsum("nc,nc->c", dy2, xhat.reshape(-1, C))
    dbeta = np.ones(dy2.shape[0], dy.dtype) @ dy2        # Σ over rows as one vector-matrix product
    g = dy * gamma
    mean_g = _row_means(g)                               # (..., 1)
    mean_gx = np.vecdot(g, xhat)[..., None]
    mean_gx /= C
    xhat *= mean_gx
    g -= mean_g
    g -= xhat
    g *= rstd
    return g, dgamma, dbeta


def _row_means(x):
    """mean(x) over the last axis, shape (..., 1), as x₂ (1/C, …, 1/C)ᵀ: a BLAS matrix-vector product."""
    C = x.shape[-1]
    return (x.reshape(-1, C) @ np.full(C, 1.0 / C, x.dtype)).reshape(*x.shape[:-1], 1)
