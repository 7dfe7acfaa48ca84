"""Softmax kernel and its vector-Jacobian product s ⊙ (g − ⟨g, s⟩)."""
from typing import NamedTuple

import numpy as np


class SoftmaxCache(NamedTuple):
    s: np.ndarray           # the probabilities: the backward needs only the output
    axis: int


def softmax_forward(x, axis=-1):
    """s_i = exp(x_i − m) / Σ_j exp(x_j − m),  with m = max_j x_j.

    Shapes: ``x: (..., n)`` -> ``s: (..., n)`` (softmax along ``axis``). Returns ``s, cache``.
    Subtracting the row maximum changes nothing mathematically (e^{−m} cancels between numerator
    and denominator) but keeps every exponent ≤ 0, so logits of ±1e4 neither overflow nor give
    0/0. An entry equal to −inf (masked) gets probability exactly 0.
    """
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    s = e / np.sum(e, axis=axis, keepdims=True)
    return s, SoftmaxCache(s, axis)


def softmax_backward(ds, cache):
    """dx = s ⊙ (g − ⟨g, s⟩)  with g = ds = ∂L/∂s.

    The Jacobian is ∂s_i/∂x_j = s_i(δ_ij − s_j) = diag(s) − s sᵀ; multiplying the upstream
    gradient by it never needs the n×n matrix: (diag(s) − s sᵀ) g = s ⊙ g − s ⟨s, g⟩.
    Shapes: ``ds: (..., n)`` -> ``dx: (..., n)``.
    """
    s, axis = cache
    g_dot_s = np.sum(ds * s, axis=axis, keepdims=True)     # ⟨g, s⟩ per row
    return s * (ds - g_dot_s)
