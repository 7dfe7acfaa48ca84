"""Inverted dropout kernel."""


def dropout_forward(x, p, rng=None, training=True):
    """y = x ⊙ m / (1 − p),  m_i ~ Bernoulli(1 − p)  (inverted dropout: E[y] = x, nothing to rescale at eval).

    Shapes: ``x: (...)`` -> ``y: (...)``. ``rng`` is a ``np.random.Generator`` (needed when
    training with p > 0). With ``training=False`` or ``p == 0`` it is the identity.
    Returns ``y, cache`` (the cache is the scaled mask m / (1 − p), or None for the identity).
    """
    if not training or p == 0.0:
        return x, None
    m = rng.random(x.shape, dtype=x.dtype) >= p          # keep with probability 1 − p
    mask = m.astype(x.dtype) * (1.0 / (1.0 - p))
    return x * mask, mask


def dropout_backward(dy, cache):
    """dx = dy ⊙ m / (1 − p): the same mask, the same scale."""
    mask = cache
    if mask is None:
        return dy
    return dy * mask
