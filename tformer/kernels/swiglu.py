"""The SwiGLU gate: silu(a) ⊙ b, the product at the heart of the gated feed-forward network."""
from typing import NamedTuple

import numpy as np


class SwiGLUCache(NamedTuple):
    a: np.ndarray           # (...), the gate
    b: np.ndarray           # (...), the value
    sig: np.ndarray         # (...), σ(a)


def swiglu_forward(a, b):
    """y = silu(a) ⊙ b,  silu(a) = a σ(a) = a / (1 + e^{−a}).

    Shapes: ``a, b: (...)``, the same shape (in the feed-forward network ``(B, T, d_ff)``: the gate
    a = x W_a and the value b = x W_b, often two halves of one ``(B, T, 2 d_ff)`` product)
    ->  ``y: (...)``. σ is computed as ½(1 + tanh(a/2)), which never overflows
    (``sigmoid_forward``'s form). The cache holds a, b and σ(a). Returns ``y, cache``.
    """
    sig = 0.5 * (1 + np.tanh(0.5 * a))                   # σ(a)
    y = a * sig * b                                      # silu(a) ⊙ b
    return y, SwiGLUCache(a, b, sig)


def swiglu_backward(dy, cache):
    """da = dy ⊙ b ⊙ σ(a)(1 + a(1 − σ(a))),  db = dy ⊙ silu(a).

    In the forward pass y = silu(a) ⊙ b is a product, so each factor's gradient is dy times the
    other factor, and a's goes on through silu'(a) = σ(a) + a σ(a)(1 − σ(a)) (the swish derivative
    of the two-layer transformer, factored). Shapes: ``dy`` like a -> ``(da, db)``, each like a.
    """
    a, b, sig = cache
    silu = a * sig
    db = dy * silu
    da = dy * b * sig * (1 + a * (1 - sig))              # silu'(a) = σ(a)(1 + a(1 − σ(a)))
    return da, db
