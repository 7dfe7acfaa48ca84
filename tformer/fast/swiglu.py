"""SwiGLU, faster: y = silu(a) ⊙ b, and its backward.

Equal to ``tformer.kernels.swiglu`` (``tests/kernels/test_fast_modern.py``). Faster because the first
axis is split across threads (``parallel.parallel_for``), every step writes into the output or
one temporary instead of a new array, and the backward can write its two gradients into buffers
it is given (``out=``, e.g. the two halves of one ``(B, T, 2 d_ff)`` gradient).
"""
import math

import numpy as np

from tformer.core import parallel
from tformer.kernels.swiglu import SwiGLUCache


def _split(fn, x):
    """Run ``fn(at)`` on slices of x's first axis (in parallel), or once on the whole of a 1-D x."""
    if x.ndim < 2:
        fn(Ellipsis)
        return
    parallel.parallel_for(lambda lo, hi: fn(slice(lo, hi)), x.shape[0],
                          grain=parallel.grain_for(math.prod(x.shape[1:]) * 4))   # x[0]: empty x


def swiglu_forward(a, b):
    """y = silu(a) ⊙ b, σ(a) = ½(1 + tanh(a/2)): ``kernels.swiglu.swiglu_forward``, split across threads.

    Shapes: ``a, b: (...)``, the same shape (strided views are fine)  ->  ``y: (...)``.
    Returns ``y, cache``; the cache holds a, b and σ(a).
    """
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
    return y, SwiGLUCache(a, b, sig)


def swiglu_backward(dy, cache, out=None):
    """da = dy ⊙ b ⊙ σ(a)(1 + a(1 − σ(a))), db = dy ⊙ silu(a): ``kernels.swiglu.swiglu_backward``,
    split across threads.

    Shapes: ``dy`` like a -> ``(da, db)``, each like a. ``out=(da, db)``: arrays (or views) to write
    the two gradients into, instead of new arrays (neither may overlap ``dy``); they are returned.
    """
    a, b, sig = cache
    if out is None:
        out = (np.empty(a.shape, a.dtype), np.empty(a.shape, a.dtype))
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
