"""Softmax kernel and its vector-Jacobian product s ⊙ (g − ⟨g, s⟩)."""
import numpy as np

from .._validate import float_array


def softmax_forward(x, axis=-1):
    """s_i = exp(x_i − m) / Σ_j exp(x_j − m),  with m = max_j x_j.

    Shapes: ``x: (..., n)`` -> ``s: (..., n)`` (softmax along ``axis``).
    Subtracting the row maximum changes nothing mathematically (it cancels between numerator and
    denominator) but keeps every exponent ≤ 0, so logits of ±1e4 neither overflow nor give 0/0.
    Entries equal to −inf (masked) get probability exactly 0. A row that is −inf everywhere
    (every key masked) has no distribution to normalise: it is defined to be all zeros, not NaN.
    NaN or +inf in ``x`` raises ValueError. Returns ``s, cache``.
    """
    float_array("x", x, min_ndim=1)
    m = x.max(axis=axis, keepdims=True)
    if np.isnan(m).any() or np.isposinf(m).any():
        raise ValueError("x: contains NaN or +inf; softmax of such a row is undefined")
    all_masked = np.isneginf(m)
    if all_masked.any():
        m = np.where(all_masked, 0, m)
    s = x - m
    np.exp(s, out=s)
    total = s.sum(axis=axis, keepdims=True)
    if all_masked.any():
        total[all_masked] = 1                          # an all-zero row stays all zeros
    s /= total
    return s, (s, axis)


def softmax_backward(ds, cache):
    """dx = s ⊙ (g − ⟨g, s⟩)  with g = ds = ∂L/∂s.

    The Jacobian is ∂s_i/∂x_j = s_i(δ_ij − s_j) = diag(s) − s sᵀ; multiplying the upstream
    gradient by it never needs the n×n matrix: (diag(s) − s sᵀ) g = s ⊙ g − s ⟨s, g⟩.
    Shapes: ``ds: (..., n)`` -> ``dx: (..., n)``.
    """
    s, axis = cache
    if ds.shape != s.shape:
        raise ValueError(f"ds: expected shape {s.shape}, got {ds.shape}")
    return s * (ds - (ds * s).sum(axis=axis, keepdims=True))
