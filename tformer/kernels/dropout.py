"""Inverted dropout kernel."""
import numpy as np

from .._dtypes import compute_dtype
from .._validate import float_array


def dropout_forward(x, p, rng=None, training=True):
    """y = x ⊙ m / (1 − p),  m_i ~ Bernoulli(1 − p)  (inverted dropout: E[y] = x, nothing to rescale at eval).

    Shapes: ``x: (...)`` -> ``y: (...)``. ``rng`` is a ``np.random.Generator`` (required when
    training with p > 0). With ``training=False`` or ``p == 0`` it is the identity.
    Returns ``y, cache`` (the cache holds the scaled mask, or None for the identity).
    """
    float_array("x", x)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p: expected a drop probability in [0, 1), got {p}")
    if not training or p == 0.0:
        return x, None
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected np.random.Generator, got {type(rng).__name__}")
    # float16/bfloat16: drawn in float32 (NumPy draws no others), so the masks are those of float32.
    keep = rng.random(x.shape, dtype=compute_dtype(x.dtype)) >= p
    mask = keep.astype(x.dtype)
    mask *= 1.0 / (1.0 - p)
    return x * mask, mask


def dropout_backward(dy, cache):
    """dx = dy ⊙ m / (1 − p): the same mask, the same scale."""
    mask = cache
    if mask is None:
        return dy
    if dy.shape != mask.shape:
        raise ValueError(f"dy: expected shape {mask.shape}, got {dy.shape}")
    return dy * mask
