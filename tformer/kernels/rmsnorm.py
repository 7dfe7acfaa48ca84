"""RMS normalisation kernel over the last axis (LayerNorm without the mean), and its backward."""
from typing import NamedTuple

import numpy as np


class RMSNormCache(NamedTuple):
    x: np.ndarray           # (..., C)
    gamma: np.ndarray       # (C,)
    rstd: np.ndarray        # (..., 1)


def rmsnorm_forward(x, gamma, eps=1e-6):
    """y = γ ⊙ x̂,  x̂ = x · rstd,  rstd = 1/√(mean(x²) + ε)  (over the last axis).

    Shapes: ``x: (..., C)``, ``gamma: (C,)``  ->  ``y: (..., C)``. Returns ``y, cache``.
    LayerNorm without the two things that make it shift-invariant: no mean is subtracted and no β
    is added. A zero row gives y = 0, finite because ε > 0. As in ``layernorm_forward``, the cache
    keeps only the per-row ``rstd`` (plus ``x``, which the caller holds anyway); the backward
    recomputes x̂.
    """
    rstd = 1 / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)   # (..., 1)
    xhat = x * rstd
    y = gamma * xhat
    return y, RMSNormCache(x, gamma, rstd)


def rmsnorm_backward(dy, cache):
    """dx = rstd ⊙ (g − x̂ ⊙ mean(g ⊙ x̂)),  g = γ ⊙ dy;  dγ = Σ dy ⊙ x̂.

    In the forward pass every x̂_i depends on the whole row through rstd alone, so the Jacobian is
    ∂x̂_i/∂x_j = rstd (δ_ij − x̂_i x̂_j / C): LayerNorm's without its −1/C term, and dx is
    LayerNorm's dx without −mean(g) (The modern block derives both). dγ sums over every row.
    Shapes: ``dy: (..., C)`` -> ``(dx: (..., C), dgamma: (C,))``.
    """
    x, gamma, rstd = cache
    xhat = x * rstd                                        # recomputed, not stored
    g = gamma * dy
    mean_gx = (g * xhat).mean(axis=-1, keepdims=True)
    dx = rstd * (g - xhat * mean_gx)
    rows = tuple(range(dy.ndim - 1))                       # every axis but the last
    dgamma = (dy * xhat).sum(axis=rows)
    return dx, dgamma
