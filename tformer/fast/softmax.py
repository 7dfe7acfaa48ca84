"""Softmax, faster: s_i = exp(x_i − m) / Σ_j exp(x_j − m), and dx = s ⊙ (g − ⟨g, s⟩).

Equal to ``tformer.kernels.softmax`` (``tests/kernels/test_fast_softmax.py``). Faster because it makes
one array (the output) and works in place on it, sums rows by a BLAS matrix-vector product, finds
the row maximum by ``fmax``, and lets attention normalise its scores in place (``_softmax_inplace``)
or shift causal rows by the query's own score (``_softmax_shifted_inplace``). float16/bfloat16 run
in float32. Defined edge cases: a row that is −inf everywhere gives zeros; NaN or +inf raises.

``softmax`` and ``softmax_weights`` are the distribution a sampler draws from (a few rows of V, no
backward): the kernel's operations in its order (the row maximum by ``max``, the row sums by
NumPy's ``sum``), so the decoders' probabilities and tokens are the kernel's to the bit.
"""
import numpy as np

from tformer.core.dtypes import is_low
from tformer.kernels.softmax import SoftmaxCache


def softmax_forward(x, axis=-1):
    """``kernels.softmax.softmax_forward``, in place on the one new array. Returns ``s, cache``."""
    s = _softmax_inplace(np.moveaxis(x, axis, -1).copy())    # the one new array: the output
    s = np.moveaxis(s, -1, axis)
    return s, SoftmaxCache(s, axis)


def softmax_weights(z):
    """w_v = e^{z_v − max_u z_u} = π_v / max_u π_u along the last axis: softmax before its division.

    Shapes: ``z: (..., V)`` -> ``w: (..., V)``, each row's largest entry exactly 1 and a −inf
    entry exactly 0. The weights a draw needs (π ∝ w) and min-p's ratio to the top probability.
    """
    return np.exp(z - z.max(axis=-1, keepdims=True))


def softmax(z):
    """π_v = w_v / Σ_u w_u,  w = ``softmax_weights(z)``: ``kernels.softmax.softmax_forward`` along the
    last axis, to the bit, without the cache. Shapes: ``z: (..., V)`` -> ``π: (..., V)``."""
    w = softmax_weights(z)
    w /= w.sum(axis=-1, keepdims=True)
    return w


_NAN_OR_INF = "x: contains NaN or +inf; softmax of such a row is undefined"


def _exp_rows(x, m, ones):
    """x ← e^{x − m} in place, row by row; returns the row sums Σ_j e^{x_j − m}, shape (..., 1),
    as one BLAS matrix-vector product with ``ones``. Dividing by them is the softmax."""
    x -= m
    np.exp(x, out=x)
    return np.matmul(x, ones)[..., None]


def _softmax_inplace(x):
    """softmax_forward along the last axis, written over ``x`` itself, returned.

    Also used directly on arrays that the caller owns: the attention scores S become the
    probabilities P, so that no second array of x's size is made, and the causal path of attention
    passes strided tiles of S. The row sums are BLAS matrix-vector products x·1 (several times
    faster than ``sum(axis=-1)`` on rows of a few hundred floats).
    In float16/bfloat16 the arithmetic runs on a float32 copy and the probabilities are rounded
    back into ``x``: a sum of n terms rounded to 11 significant bits at every step can be off by
    about n·2⁻¹¹ of itself.
    """
    if x.size == 0:                 # no rows, or rows of length 0: nothing to normalise
        return x
    if is_low(x.dtype):
        np.copyto(x, _softmax_inplace(x.astype(np.float32)), casting="same_kind")
        return x
    # The row maximum by fmax, which skips NaN: it equals max on every row without NaN, and on
    # short rows NumPy's fmax reduction takes about 60 % of the time of its max (rows of 64: the
    # small model's attention scores, with AVX-512). A row holding NaN is caught below instead,
    # by its NaN sum.
    m = np.fmax.reduce(x, axis=-1, keepdims=True)
    if np.isnan(m).any() or np.isposinf(m).any():
        raise ValueError(_NAN_OR_INF)
    all_masked = np.isneginf(m)
    if all_masked.any():
        m = np.where(all_masked, 0, m)
    total = _exp_rows(x, m, np.ones(x.shape[-1], x.dtype))          # (..., 1)
    if np.isnan(total).any():                          # a NaN that fmax skipped: e^{NaN − m}
        raise ValueError(_NAN_OR_INF)
    if all_masked.any():
        total[all_masked] = 1                          # an all-zero row stays all zeros
    x /= total
    return x


def _softmax_shifted_inplace(x, m):
    """softmax along the last axis written over ``x``, each row shifted by its own ``m`` (..., 1)
    instead of its maximum; returns True, or False when the shift did not fit.

        s_i = e^{x_i − m} / Σ_j e^{x_j − m}      (the same s for every m: e^{−m} cancels)

    The maximum is one choice of m, the one that keeps every exponent ≤ 0. Causal attention has a
    cheaper one: the query's own score s_ii is in its row (a query always sees itself), so with
    m = s_ii the row sum holds e⁰ = 1 and is ≥ 1, nothing underflows that the maximum would have
    kept, and only an exponent above ln(float max) ≈ 88.7 (float32) can overflow. Finding m is
    then a strided read of T numbers instead of a reduction over T² (the chapter "Performance"
    measures the row maximum's share of a softmax). Where a row sum is not a finite number ≥ 1 (overflow, NaN or
    ±inf among the scores), this returns False and ``x`` is undefined: the caller recomputes
    the scores and takes ``_softmax_inplace``, which shifts by the maximum and raises on NaN.
    float32 and float64 only (low precision goes through ``_softmax_inplace``).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        x -= m
        np.exp(x, out=x)
    total = np.matmul(x, np.ones(x.shape[-1], x.dtype))[..., None]   # (..., 1)
    if not (total.min() >= 1 and total.max() <= np.finfo(x.dtype).max):   # NaN fails both
        return False
    x /= total
    return True


def softmax_backward(ds, cache):
    """dx = s ⊙ (g − ⟨g, s⟩), g = ds: ``kernels.softmax.softmax_backward``, on one copy of ``ds``."""
    s, axis = cache
    return _softmax_backward_inplace(ds.copy(), s, axis)   # the one new array: the result


def _softmax_backward_inplace(g, s, axis=-1):
    """g ← s ⊙ (g − ⟨g, s⟩) along ``axis``, written over ``g`` (any strides), returned.

    ⟨g, s⟩ per row is a dot product (np.vecdot: no temporary g ⊙ s). Attention calls this on its
    own dP (or a tile of it), so that dS takes no array of its own. float16/bfloat16: computed on
    float32 copies, rounded back into ``g``.
    """
    if is_low(g.dtype):
        g32 = _softmax_backward_inplace(g.astype(np.float32), s.astype(np.float32), axis)
        np.copyto(g, g32, casting="same_kind")
        return g
    g -= np.expand_dims(np.vecdot(g, s, axis=axis), axis)
    g *= s
    return g
