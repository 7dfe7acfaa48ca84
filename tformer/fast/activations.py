"""Activations, faster: y = max(0, x), σ(x), h σ(h), x Φ(x), and their derivatives.

Equal to ``tformer.kernels.activations`` (``tests/kernels/test_fast_activations.py``). Faster where it
counts, in GELU (tanh form), the activation of TinyGPT: every step in place on one temporary, the
constants folded, σ(2u) = ½(1 + tanh u) computed with one exp instead of one tanh, the elements
split across threads (``parallel.parallel_for``), and the backward written into a buffer it is
given (``out=``, e.g. ``dy`` itself). float16/bfloat16 run in float32 and are rounded once.
"""
import math

import numpy as np

from tformer.core import parallel
from tformer.core.dtypes import is_low
from tformer.kernels.activations import (GELU_C, SQRT_2_OVER_PI, GeluCache, SwishCache, _erf,  # noqa: F401
                                   relu2_backward, relu2_forward, relu_backward, relu_forward,
                                   sigmoid_backward, swish_backward)

_GELU_A, _GELU_B = -2 * SQRT_2_OVER_PI, -2 * SQRT_2_OVER_PI * GELU_C        # −2u = x (a + b x²)
_GELU_DA, _GELU_DB = 2 * SQRT_2_OVER_PI, 6 * SQRT_2_OVER_PI * GELU_C        # 2x u'(x) = x (a' + b' x²)

# relu_forward/backward, relu2_forward/backward, sigmoid_backward and swish_backward are the
# kernels' own (imported above):
# one elementwise expression each, nothing to make faster.


def sigmoid_forward(x):
    """σ(x) = 1 / (1 + e^{−x}), computed as ½(1 + tanh(x/2)), which never overflows.

    Shapes: ``x: (...)`` -> ``y: (...)``, in x's dtype. Returns ``y, cache``.
    float16/bfloat16: computed in float32 and rounded once (bfloat16 times a Python float is
    float32 in ml_dtypes, which silently upcast y before).
    """
    if is_low(x.dtype):
        y = sigmoid_forward(x.astype(np.float32))[0].astype(x.dtype)
        return y, y
    y = np.tanh(x * 0.5)
    y += 1
    y *= 0.5
    return y, y


def swish_forward(h):
    """swish(h) = h ⊙ σ(h)  (SiLU; the two-layer transformer's S' = H ⊙ σ(H)).

    Shapes: ``h: (...)`` -> ``y: (...)``. Saves ``h`` and ``σ(h)``. Returns ``y, cache``.
    """
    sig, _ = sigmoid_forward(h)
    return h * sig, SwishCache(h, sig)


def gelu_forward(x, approximate="tanh"):
    """GELU(x) = x Φ(x).

    ``approximate="none"``: Φ(x) = ½(1 + erf(x/√2)), exact (erf is evaluated per element with
    ``math.erf``: correct to the last bit but slow, meant for derivations and checks).
    ``approximate="tanh"``: Φ(x) ≈ ½(1 + tanh(u)), u = √(2/π)(x + 0.044715 x³), Hendrycks &
    Gimpel's tanh form (after Page 1977; GPT-2 uses it), used in training. Since
    ½(1 + tanh u) = σ(2u) = 1/(1 + e^{−2u}), it is computed as

        s = 1 / (1 + e^{−2u}),   y = x s

    one exp instead of one tanh, the same value. Which of the two is cheaper depends on the CPU:
    with AVX-512, NumPy's float32 tanh is the faster; without it, tanh is the slower, by far on
    older CPUs (the chapter "Performance" times both). For x ≪ 0,
    e^{−2u} overflows to inf and s is exactly 0, as it should be.
    Shapes: ``x: (...)`` -> ``y: (...)``. The cache holds ``x`` and ``s``. Returns ``y, cache``.
    float16/bfloat16: the chain runs in float32 and y and s are rounded once, at the end (NumPy's
    float16 arithmetic converts every element in software, about ten times slower than float32;
    and in float16, x (a' + b' x²) of the backward overflows from ``|x|`` ≈ 66).
    """
    if is_low(x.dtype):
        y, (_, s, _) = gelu_forward(x.astype(np.float32), approximate)
        return y.astype(x.dtype), GeluCache(x, s.astype(x.dtype), approximate)
    if approximate == "tanh":
        xf = x.reshape(-1)
        y, s = np.empty_like(xf), np.empty_like(xf)

        def part(lo, hi):
            with np.errstate(over="ignore", under="ignore"):
                _gelu_tanh_rows(xf[lo:hi], s[lo:hi], y[lo:hi])

        parallel.parallel_for(part, xf.size, grain=parallel.grain_for(1))
        return y.reshape(x.shape), GeluCache(x, s.reshape(x.shape), approximate)
    phi = (0.5 * (1.0 + _erf(x * (1 / math.sqrt(2.0))))).astype(x.dtype)     # "none": exact
    return x * phi, GeluCache(x, phi, approximate)


def _gelu_tanh_rows(x, s, y):
    """s = σ(2u) = 1/(1 + e^{−2u}), y = x s (GELU, tanh form) for a block ``x``, written into ``s``
    and ``y`` (``y`` may be ``x`` itself). The caller holds ``np.errstate(over="ignore",
    under="ignore")``: e^{−2u} → inf for x ≪ 0 and 0 for x ≫ 0, both exact limits."""
    # Every step in place on one temporary, x·x·x and not x**3 (a slow pow), with the
    # constants folded: −2u = −2√(2/π)(x + c x³) = x (a + b x²), a = −2√(2/π), b = a c.
    np.multiply(x, x, out=s)
    s *= _GELU_B
    s += _GELU_A
    s *= x                                       # −2u
    np.exp(s, out=s)                             # e^{−2u}
    s += 1
    np.reciprocal(s, out=s)                      # s = σ(2u) = ½(1 + tanh u), reused in backward
    np.multiply(x, s, out=y)


def gelu_backward(dy, cache, out=None):
    """dx = dy ⊙ GELU'(x).

    Exact: GELU'(x) = Φ(x) + x φ(x), with φ(x) = e^{−x²/2}/√(2π).
    Tanh form: with t = tanh(u), u = √(2/π)(x + c x³):
    GELU'(x) = ½(1 + t) + ½ x (1 − t²) √(2/π)(1 + 3c x²). With s = ½(1 + t) from the forward pass,
    1 − t² = 4 s (1 − s), so GELU'(x) = s [1 + 2 x u'(x) (1 − s)]: the same value, computed in place.
    ``out``: an array of x's shape to write dx into (it may be ``dy`` itself), instead of a new one.
    """
    x, saved, approximate = cache
    if is_low(x.dtype):                              # in float32, as the forward pass
        dx = gelu_backward(dy.astype(np.float32),
                           GeluCache(x.astype(np.float32), saved.astype(np.float32), approximate))
        if out is None:
            return dx.astype(x.dtype)
        np.copyto(out, dx, casting="same_kind")
        return out
    if approximate == "tanh":
        xf, sf, dyf = x.reshape(-1), saved.reshape(-1), dy.reshape(-1)
        dx = np.empty_like(xf) if out is None else out.reshape(-1)
        parallel.parallel_for(lambda lo, hi: _gelu_tanh_backward(xf[lo:hi], sf[lo:hi], dyf[lo:hi], dx[lo:hi],
                                                                 out is not None),
                              xf.size, grain=parallel.grain_for(1))
        return dx.reshape(x.shape) if out is None else out
    phi_cdf = saved                                  # exact: Φ(x) + x φ(x)
    pdf = np.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
    dx = dy * (phi_cdf + x * pdf)
    if out is None:
        return dx
    np.copyto(out, dx)
    return out


def _gelu_tanh_backward(xs, s, dy, dx, dx_may_be_dy):
    """dx = dy ⊙ s [1 + 2 x u'(x) (1 − s)] on one block, every step in place. ``dx_may_be_dy``: the
    output is a buffer the caller gave (possibly ``dy`` itself), so the chain runs in a scratch buffer."""
    du = parallel.scratch("gelu_du", s.shape, s.dtype) if dx_may_be_dy else dx
    np.multiply(xs, xs, out=du)
    du *= _GELU_DB
    du += _GELU_DA
    du *= xs                                         # 2 x u'(x) = 2√(2/π) x (1 + 3c x²) = x (a' + b' x²)
    w = np.subtract(1, s, out=parallel.scratch("gelu_w", s.shape, s.dtype))   # 1 − s
    du *= w
    du += 1                                          # 1 + 2 x u'(x)(1 − s)
    du *= s
    np.multiply(du, dy, out=dx)
