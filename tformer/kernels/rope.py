"""Rotary position embedding (RoPE): each pair of channels rotated by an angle that grows with the position."""
import numbers
from typing import NamedTuple

import numpy as np


class RopeCache(NamedTuple):
    cos: np.ndarray         # (T, D/2), cos φ in x's dtype
    sin: np.ndarray         # (T, D/2), sin φ in x's dtype
    shape: tuple            # x's shape, (..., T, D)


def rope_angles(positions, D, base=10000.0):
    """φ[t, i] = p_t · θ_i,  θ_i = base^(−2i/D),  i = 0 … D/2 − 1.

    Shapes: ``positions: (T,)`` -> ``(cos φ, sin φ)``, each ``(T, D/2)`` float64. The angles are
    computed in float64 (a position of a few thousand times θ_0 = 1 keeps its fractional part).
    """
    if isinstance(D, bool) or not isinstance(D, numbers.Integral) or D < 2 or D % 2:
        raise ValueError(f"D: expected an even head size ≥ 2, got {D!r}")
    base = _check_base(base)
    theta = np.power(base, -np.arange(0, D, 2, dtype=np.float64) / D)     # (D/2,)
    phi = np.asarray(positions, np.float64)[:, None] * theta[None, :]     # (T, D/2)
    return np.cos(phi), np.sin(phi)


def _check_base(base):
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not (np.isfinite(base) and base > 0):
        raise ValueError(f"base: expected a positive finite number, got {base!r}")
    return float(base)


def position_values(positions, T):
    """``None`` -> 0 … T−1; an integer offset o -> o … o+T−1; else the ``(T,)`` array itself; float64."""
    if positions is None:
        return np.arange(T, dtype=np.float64)
    if isinstance(positions, numbers.Integral):
        return np.arange(positions, positions + T, dtype=np.float64)
    return np.asarray(positions, np.float64)


def _positions(positions, T):
    """``None`` -> 0 … T−1; an integer offset o ≥ 0 -> o … o+T−1; else a finite ``(T,)`` array."""
    if positions is None:
        return np.arange(T, dtype=np.float64)
    if isinstance(positions, numbers.Integral) and not isinstance(positions, bool):
        if positions < 0:
            raise ValueError(f"positions: expected an offset ≥ 0, got {positions}")
        return np.arange(positions, positions + T, dtype=np.float64)
    if not isinstance(positions, np.ndarray) or positions.dtype == bool or \
            not (np.issubdtype(positions.dtype, np.integer) or np.issubdtype(positions.dtype, np.floating)):
        raise TypeError(f"positions: expected None, an integer offset or a NumPy array of numbers, "
                        f"got {getattr(positions, 'dtype', type(positions).__name__)}")
    if positions.shape != (T,):
        raise ValueError(f"positions: expected shape ({T},) (one per position of x), got {positions.shape}")
    if not np.isfinite(positions).all():
        raise ValueError("positions: contains NaN or inf")
    return positions.astype(np.float64)


def rope_forward(x, positions=None, base=10000.0):
    """y₂ᵢ = x₂ᵢ cos φᵢ − x₂ᵢ₊₁ sin φᵢ,  y₂ᵢ₊₁ = x₂ᵢ sin φᵢ + x₂ᵢ₊₁ cos φᵢ,  φᵢ = p · base^(−2i/D).

    Shapes: ``x: (..., T, D)`` with D even (typically ``(B, H, T, D)`` queries or keys)  ->
    ``y: (..., T, D)``. The pairs are interleaved, (x₀, x₁), (x₂, x₃), …, as in the RoFormer paper:
    each is a 2-vector turned by the 2×2 rotation R(φᵢ), so y = R x with R block-diagonal and
    orthogonal (lengths are kept).
    ``positions``: the position p of each of the T rows; ``None`` means 0 … T−1, an integer
    ``o`` means o … o+T−1 (new tokens that follow o positions already in a KV cache), or a
    ``(T,)`` array of numbers. ``base`` sets the slowest frequency (θ_{D/2−1} ≈ 1/base).
    Returns ``y, cache``; the cache holds only the ``(T, D/2)`` tables cos φ and sin φ.
    """
    T, D = x.shape[-2:]
    cos, sin = rope_angles(position_values(positions, T), D, base)     # (T, D/2) each
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]                                 # (..., T, D/2) each
    y = np.empty_like(x)
    y[..., 0::2] = x0 * cos - x1 * sin
    y[..., 1::2] = x0 * sin + x1 * cos
    return y, RopeCache(cos, sin, x.shape)


def rope_backward(dy, cache):
    """dx = Rᵀ dy = R(−φ) dy:  dx₂ᵢ = dy₂ᵢ cos φᵢ + dy₂ᵢ₊₁ sin φᵢ,  dx₂ᵢ₊₁ = −dy₂ᵢ sin φᵢ + dy₂ᵢ₊₁ cos φᵢ.

    In the forward pass y = R x with R a fixed (input-independent) rotation, so the Jacobian is R
    and the vector-Jacobian product is Rᵀ dy; a rotation's transpose is its inverse, the rotation
    by −φ. The backward is the forward with sin φ negated.
    Shapes: ``dy: (..., T, D)`` -> ``dx: (..., T, D)``.
    """
    cos, sin, _ = cache
    dy0, dy1 = dy[..., 0::2], dy[..., 1::2]
    dx = np.empty_like(dy)
    dx[..., 0::2] = dy0 * cos + dy1 * sin
    dx[..., 1::2] = -dy0 * sin + dy1 * cos
    return dx
