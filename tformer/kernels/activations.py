"""Elementwise activations: ReLU, sigmoid, swish (SiLU) and GELU (exact and tanh), forward and backward."""
import math

import numpy as np

from .._validate import float_array

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _check_dy(dy, shape):
    if dy.shape != shape:
        raise ValueError(f"dy: expected shape {shape}, got {dy.shape}")


def relu_forward(x):
    """y = max(0, x).  Shapes: ``x: (...)`` -> ``y: (...)``. Returns ``y, cache``."""
    float_array("x", x)
    y = np.maximum(x, 0)
    return y, y


def relu_backward(dy, cache):
    """dx = dy ⊙ 1[x > 0]  (the subgradient at 0 is taken as 0).  ``y`` stands in for ``x``: y > 0 ⇔ x > 0."""
    y = cache
    _check_dy(dy, y.shape)
    return dy * (y > 0)


def sigmoid_forward(x):
    """σ(x) = 1 / (1 + e^{−x}), computed as ½(1 + tanh(x/2)), which never overflows.

    Shapes: ``x: (...)`` -> ``y: (...)``. Returns ``y, cache``.
    """
    float_array("x", x)
    y = np.tanh(x * 0.5)
    y += 1
    y *= 0.5
    return y, y


def sigmoid_backward(dy, cache):
    """dx = dy ⊙ σ(x)(1 − σ(x)).  Only σ(x) is saved: the derivative is a function of the output."""
    y = cache
    _check_dy(dy, y.shape)
    return dy * y * (1 - y)


def swish_forward(h):
    """swish(h) = h ⊙ σ(h)  (SiLU; seed 000's S' = H ⊙ σ(H)).

    Shapes: ``h: (...)`` -> ``y: (...)``. Saves ``h`` and ``σ(h)``. Returns ``y, cache``.
    """
    sig, _ = sigmoid_forward(h)
    return h * sig, (h, sig)


def swish_backward(dy, cache):
    """dh = dy ⊙ [σ(h) + h ⊙ σ(h) ⊙ (1 − σ(h))], written exactly as seed 000 writes it."""
    h, sig = cache
    _check_dy(dy, h.shape)
    return dy * (sig + h * sig * (1 - sig))


def gelu_forward(x, approximate="tanh"):
    """GELU(x) = x Φ(x).

    ``approximate="none"``: Φ(x) = ½(1 + erf(x/√2)), exact (erf is evaluated per element with
    ``math.erf``: correct to the last bit but slow, meant for derivations and checks).
    ``approximate="tanh"``: Φ(x) ≈ ½(1 + tanh(√(2/π)(x + 0.044715 x³))), GPT-2's form, used in training.
    Shapes: ``x: (...)`` -> ``y: (...)``. Returns ``y, cache``.
    """
    float_array("x", x)
    if approximate == "tanh":
        # u = √(2/π)(x + c x³) written as √(2/π) x (1 + c x²): x·x·x, not x**3 (a slow pow), and
        # every step in place on the one temporary u, which then holds t.
        u = x * x
        u *= GELU_C
        u += 1
        u *= x
        u *= SQRT_2_OVER_PI
        t = np.tanh(u, out=u)                        # t = tanh(√(2/π)(x + c x³)), reused in backward
        y = t + 1
        y *= x
        y *= 0.5
        return y, (x, t, approximate)
    if approximate == "none":
        phi = (0.5 * (1.0 + _erf(x * (1 / math.sqrt(2.0))))).astype(x.dtype)
        return x * phi, (x, phi, approximate)
    raise ValueError(f"approximate: expected 'tanh' or 'none', got {approximate!r}")


def gelu_backward(dy, cache):
    """dx = dy ⊙ GELU'(x).

    Exact: GELU'(x) = Φ(x) + x φ(x), with φ(x) = e^{−x²/2}/√(2π).
    Tanh form: with t = tanh(u), u = √(2/π)(x + c x³):
    GELU'(x) = ½(1 + t) + ½ x (1 − t²) √(2/π)(1 + 3c x²). ``t`` comes from the forward pass.
    """
    x, saved, approximate = cache
    _check_dy(dy, x.shape)
    if approximate == "tanh":
        t = saved
        # Factored as ½(1 + t)·[1 + x u'(x)(1 − t)], since 1 − t² = (1 − t)(1 + t): the same value,
        # computed in place on two temporaries (du and w) instead of a fresh array per operation.
        du = x * x
        du *= 3 * GELU_C
        du += 1
        du *= x
        du *= SQRT_2_OVER_PI                         # x u'(x) = √(2/π) x (1 + 3c x²)
        w = np.subtract(1, t, dtype=t.dtype)         # 1 − t
        du *= w
        du += 1                                      # 1 + x u'(x)(1 − t)
        np.add(t, 1, out=w)                          # 1 + t
        du *= w
        du *= dy
        du *= 0.5
        return du
    phi_cdf = saved
    pdf = np.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
    return dy * (phi_cdf + x * pdf)
