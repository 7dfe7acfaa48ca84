"""Rotary position embedding (RoPE): each pair of channels rotated by an angle that grows with the position."""
import math
import numbers

import numpy as np

from .. import parallel
from .._validate import float_array


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
    float_array("x", x, min_ndim=2)
    T, D = x.shape[-2:]
    if D < 2 or D % 2:
        raise ValueError(f"x: expected an even last axis D (pairs of channels), got shape {x.shape}")
    cos, sin = rope_angles(_positions(positions, T), D, base)
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    y = np.empty(x.shape, x.dtype)
    _rotate(x, cos, sin, y)
    return y, (cos, sin, x.shape)


def rope_backward(dy, cache, out=None):
    """dx = Rᵀ dy = R(−φ) dy:  dx₂ᵢ = dy₂ᵢ cos φᵢ + dy₂ᵢ₊₁ sin φᵢ,  dx₂ᵢ₊₁ = −dy₂ᵢ sin φᵢ + dy₂ᵢ₊₁ cos φᵢ.

    In the forward pass y = R x with R a fixed (input-independent) rotation, so the Jacobian is R
    and the vector-Jacobian product is Rᵀ dy; a rotation's transpose is its inverse, the rotation
    by −φ. The backward is the forward with sin φ negated.
    Shapes: ``dy: (..., T, D)`` -> ``dx: (..., T, D)``. ``out``: an array of that shape to write dx
    into (it may be ``dy`` itself, or a view such as a head of a fused gradient buffer).
    """
    cos, sin, shape = cache
    if dy.shape != shape:
        raise ValueError(f"dy: expected shape {shape}, got {dy.shape}")
    if out is None:
        out = np.empty(shape, dy.dtype)
    elif not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dy.dtype:
        raise ValueError(f"out: expected a {dy.dtype} array of shape {shape}, got "
                         f"{getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}")
    _rotate(dy, cos, -sin, out)
    return out


def _rotate(x, cos, sin, out):
    """out = R(φ) x pair by pair; ``out`` may be ``x`` itself (both halves are computed first).

    Each part is copied to a contiguous array first: on a strided view (a head of the fused
    q, k, v projection, as ``split_heads`` returns it) taking every other channel makes NumPy's
    inner loops 16 elements long, and the rotation is several times slower than the copy plus
    the rotation (measured on one (64, 4, 64, 32) float32 head view: 8.4 ms against 1.3 ms).
    Split along the first axis across threads when there is one besides (T, D)."""
    def part(lo, hi):
        at = slice(lo, hi) if x.ndim > 2 else Ellipsis
        xc = np.ascontiguousarray(x[at])
        x0, x1 = xc[..., 0::2], xc[..., 1::2]             # (..., T, D/2) each
        even = x0 * cos
        even -= x1 * sin                                  # x₂ᵢ cos φ − x₂ᵢ₊₁ sin φ
        odd = x0 * sin
        odd += x1 * cos                                   # x₂ᵢ sin φ + x₂ᵢ₊₁ cos φ
        out[at][..., 0::2] = even
        out[at][..., 1::2] = odd

    items = x.shape[0] if x.ndim > 2 else 1
    parallel.parallel_for(part, items, grain=parallel.grain_for(
        math.prod(x.shape[1:]) * 4 if x.ndim > 2 else x.size))   # not x[0]: x may be empty
