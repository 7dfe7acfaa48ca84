"""The SwiGLU gate: silu(a) ⊙ b, the product at the heart of the gated feed-forward network."""
import math

import numpy as np

from .. import parallel
from .._validate import float_array, same_dtype


def _split(fn, x):
    """Run ``fn(at)`` on slices of x's first axis (in parallel), or once on the whole of a 1-D x."""
    if x.ndim < 2:
        fn(Ellipsis)
        return
    parallel.parallel_for(lambda lo, hi: fn(slice(lo, hi)), x.shape[0],
                          grain=parallel.grain_for(math.prod(x.shape[1:]) * 4))   # x[0]: empty x


def swiglu_forward(a, b):
    """y = silu(a) ⊙ b,  silu(a) = a σ(a) = a / (1 + e^{−a}).

    Shapes: ``a, b: (...)``, the same shape (in the feed-forward network ``(B, T, d_ff)``: the gate
    a = x W_a and the value b = x W_b, often two halves of one ``(B, T, 2 d_ff)`` product; strided
    views are fine)  ->  ``y: (...)``. σ is computed as ½(1 + tanh(a/2)), which never overflows
    (``sigmoid_forward``'s form). The cache holds a, b and σ(a). Returns ``y, cache``.
    """
    float_array("a", a)
    float_array("b", b)
    if a.shape != b.shape:
        raise ValueError(f"b: expected the shape of a, {a.shape}, got {b.shape}")
    same_dtype(a=a, b=b)
    sig, y = np.empty(a.shape, a.dtype), np.empty(a.shape, a.dtype)

    def part(at):
        s = sig[at]
        np.multiply(a[at], 0.5, out=s)
        np.tanh(s, out=s)
        s += 1
        s *= 0.5                                         # σ(a)
        np.multiply(a[at], s, out=y[at])                 # silu(a)
        y[at] *= b[at]                                   # silu(a) ⊙ b

    _split(part, a)
    return y, (a, b, sig)


def swiglu_backward(dy, cache, out=None):
    """da = dy ⊙ b ⊙ σ(a)(1 + a(1 − σ(a))),  db = dy ⊙ silu(a).

    In the forward pass y = silu(a) ⊙ b is a product, so each factor's gradient is dy times the
    other factor, and a's goes on through silu'(a) = σ(a) + a σ(a)(1 − σ(a)) (the swish derivative
    of the two-layer transformer, factored). Shapes: ``dy`` like a -> ``(da, db)``, each like a.
    ``out=(da, db)``: arrays (or views, e.g. the two halves of one ``(B, T, 2 d_ff)`` gradient) to
    write the two gradients into, instead of new arrays (neither may overlap ``dy``); they are returned.
    """
    a, b, sig = cache
    if dy.shape != a.shape:
        raise ValueError(f"dy: expected shape {a.shape}, got {dy.shape}")
    if out is None:
        out = (np.empty(a.shape, a.dtype), np.empty(a.shape, a.dtype))
    elif len(out) != 2 or any(not isinstance(o, np.ndarray) or o.shape != a.shape or o.dtype != a.dtype
                              for o in out):
        raise ValueError(f"out: expected two {a.dtype} arrays (da, db) of shape {a.shape}")
    da, db = out

    def part(at):
        s, av, dyv = sig[at], a[at], dy[at]
        t = np.multiply(av, s, out=np.empty_like(s))     # silu(a) (an array even when 0-d)
        np.multiply(dyv, t, out=db[at])                  # db = dy ⊙ silu(a)
        np.subtract(av, t, out=t)                        # a − a σ(a) = a(1 − σ(a))
        t += 1
        t *= s                                           # silu'(a) = σ(a)(1 + a(1 − σ(a)))
        t *= b[at]
        np.multiply(dyv, t, out=da[at])                  # da = dy ⊙ b ⊙ silu'(a)

    _split(part, a)
    return da, db
