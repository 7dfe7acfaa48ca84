"""Inverted dropout, as the layers call it: y = x ⊙ m / (1 − p), m_i ~ Bernoulli(1 − p).

Equal to ``tformer.kernels.dropout`` (``tests/kernels/test_fast_dropout.py``) for float32 and float64: the
same draws from the same generator, the scale multiplied into the mask in place. float16/bfloat16:
the uniform numbers are drawn in float32 (NumPy draws no others), so the masks are those of float32.
"""
from tformer.core.dtypes import compute_dtype
from tformer.kernels.dropout import dropout_backward  # noqa: F401 (nothing to make faster: one product)


def dropout_forward(x, p, rng=None, training=True):
    """y = x ⊙ m / (1 − p); the identity when not training or p = 0. Returns ``y, cache``."""
    if not training or p == 0.0:
        return x, None
    keep = rng.random(x.shape, dtype=compute_dtype(x.dtype)) >= p
    mask = keep.astype(x.dtype)
    mask *= 1.0 / (1.0 - p)
    return x * mask, mask

