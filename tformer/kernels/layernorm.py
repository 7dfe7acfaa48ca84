"""Layer normalisation kernel over the last axis, and its compact backward."""
from typing import NamedTuple

import numpy as np


class LayerNormCache(NamedTuple):
    x: np.ndarray           # (..., C)
    gamma: np.ndarray       # (C,)
    mu: np.ndarray          # (..., 1)
    rstd: np.ndarray        # (..., 1)


def layernorm_forward(x, gamma, beta, eps=1e-5):
    """y = γ ⊙ x̂ + β,  x̂ = (x − μ) · rstd,  μ = mean(x),  rstd = 1/√(var(x) + ε)  (over the last axis).

    Shapes: ``x: (..., C)``, ``gamma, beta: (C,)``  ->  ``y: (..., C)``. Returns ``y, cache``.
    A constant row has var = 0: x̂ = 0 and y = β, finite because ε > 0.
    Like llm.c, the cache keeps only the small per-row ``mu`` and ``rstd`` (plus ``x``, which the
    caller holds anyway) and the backward recomputes the cheap, large x̂.
    """
    mu = x.mean(axis=-1, keepdims=True)                    # (..., 1)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)     # (..., 1), the biased variance
    rstd = 1 / np.sqrt(var + eps)
    xhat = (x - mu) * rstd
    y = gamma * xhat + beta
    return y, LayerNormCache(x, gamma, mu, rstd)


def layernorm_backward(dy, cache):
    """dx = rstd ⊙ (g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)),  g = γ ⊙ dy;  dγ = Σ dy ⊙ x̂;  dβ = Σ dy.

    In the forward pass every x̂_i depends on the whole row through μ and rstd; the two means are
    what that dependence contributes (the chapter "LayerNorm: the full backward" shows that this
    equals the post-LN encoder's three-term g_σ², g_μ form). dγ and dβ sum over every row (all
    leading axes).
    Shapes: ``dy: (..., C)`` -> ``(dx: (..., C), dgamma: (C,), dbeta: (C,))``.
    """
    x, gamma, mu, rstd = cache
    xhat = (x - mu) * rstd                                 # recomputed, not stored
    g = gamma * dy
    mean_g = g.mean(axis=-1, keepdims=True)
    mean_gx = (g * xhat).mean(axis=-1, keepdims=True)
    dx = rstd * (g - mean_g - xhat * mean_gx)
    rows = tuple(range(dy.ndim - 1))                       # every axis but the last
    dgamma = (dy * xhat).sum(axis=rows)
    dbeta = dy.sum(axis=rows)
    return dx, dgamma, dbeta
