"""Elementwise activations: ReLU, its square, sigmoid, swish (SiLU) and GELU (exact and tanh), forward and
backward.

An elementwise y = f(x) has a diagonal Jacobian, so every backward here is dx = dy ⊙ f'(x).
"""
import math
from typing import NamedTuple

import numpy as np

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715
_erf = np.vectorize(math.erf, otypes=[np.float64])     # NumPy has no erf: math.erf per element


class SwishCache(NamedTuple):
    h: np.ndarray
    sig: np.ndarray         # σ(h)


class GeluCache(NamedTuple):
    x: np.ndarray
    phi: np.ndarray         # Φ(x), or s = ½(1 + tanh u) in the tanh form
    approximate: str


def relu_forward(x):
    """y = max(0, x).  Shapes: ``x: (...)`` -> ``y: (...)``. Returns ``y, cache`` (the cache is y)."""
    y = np.maximum(x, 0)
    return y, y


def relu_backward(dy, cache):
    """dx = dy ⊙ 1[x > 0]  (the subgradient at 0 is taken as 0).  ``y`` stands in for ``x``: y > 0 ⇔ x > 0."""
    y = cache
    return dy * (y > 0)


def relu2_forward(x):
    """y = max(0, x)², ReLU squared (So et al. 2021, "Primer"; the MLP of modded-nanogpt's records).

    Shapes: ``x: (...)`` -> ``y: (...)``. Returns ``y, cache`` (the cache is r = max(0, x)).
    """
    r = np.maximum(x, 0)
    return r * r, r


def relu2_backward(dy, cache):
    """dx = dy ⊙ 2 max(0, x): y = r², r = max(0, x), so y' = 2r·1[x > 0] = 2r (r is 0 where the
    indicator is). Continuous at 0, unlike ReLU's derivative. ``cache``: r, the shape of ``dy``."""
    r = cache
    return dy * (r + r)


def sigmoid_forward(x):
    """σ(x) = 1 / (1 + e^{−x}), computed as ½(1 + tanh(x/2)), which never overflows.

    Shapes: ``x: (...)`` -> ``y: (...)``, in x's dtype. Returns ``y, cache`` (the cache is y).
    """
    y = (np.tanh(x * 0.5) + 1) * 0.5
    return y, y


def sigmoid_backward(dy, cache):
    """dx = dy ⊙ σ(x)(1 − σ(x)).  Only σ(x) is saved: the derivative is a function of the output."""
    y = cache
    return dy * y * (1 - y)


def swish_forward(h):
    """swish(h) = h ⊙ σ(h)  (SiLU; the two-layer transformer's S' = H ⊙ σ(H)).

    Shapes: ``h: (...)`` -> ``y: (...)``. Saves ``h`` and ``σ(h)``. Returns ``y, cache``.
    """
    sig, _ = sigmoid_forward(h)
    return h * sig, SwishCache(h, sig)


def swish_backward(dy, cache):
    """dh = dy ⊙ [σ(h) + h ⊙ σ(h) ⊙ (1 − σ(h))], written exactly as the two-layer transformer
    writes it."""
    h, sig = cache
    return dy * (sig + h * sig * (1 - sig))


def gelu_forward(x, approximate="tanh"):
    """GELU(x) = x Φ(x).

    ``approximate="none"``: Φ(x) = ½(1 + erf(x/√2)), exact.
    ``approximate="tanh"``: Φ(x) ≈ s = ½(1 + tanh u), u = √(2/π)(x + c x³), c = 0.044715
    (Hendrycks & Gimpel's tanh form, after Page 1977; GPT-2 uses it).
    Shapes: ``x: (...)`` -> ``y: (...)``. The cache holds ``x`` and Φ(x) (or s). Returns ``y, cache``.
    """
    if approximate == "tanh":
        u = SQRT_2_OVER_PI * (x + GELU_C * x**3)
        phi = 0.5 * (1 + np.tanh(u))                     # s
    else:
        phi = (0.5 * (1 + _erf(x / math.sqrt(2)))).astype(x.dtype)
    return x * phi, GeluCache(x, phi, approximate)


def gelu_backward(dy, cache):
    """dx = dy ⊙ GELU'(x).

    Exact: GELU'(x) = Φ(x) + x φ(x), with φ(x) = e^{−x²/2}/√(2π) the normal density.
    Tanh form: GELU'(x) = ½(1 + t) + ½ x (1 − t²) u'(x), t = tanh u; with s = ½(1 + t) from the
    forward pass, 1 − t² = 4 s (1 − s), so GELU'(x) = s [1 + 2 x u'(x) (1 − s)],
    x u'(x) = √(2/π) x (1 + 3c x²).
    """
    x, phi, approximate = cache
    if approximate == "tanh":
        s = phi
        x_du = SQRT_2_OVER_PI * x * (1 + 3 * GELU_C * x**2)     # x u'(x)
        return dy * (s * (1 + 2 * x_du * (1 - s)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)         # φ(x)
    return dy * (phi + x * pdf)
