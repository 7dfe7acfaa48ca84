"""The layers of the modern block: RMSNorm, the SwiGLU feed-forward network, the tied LM head.

Each wraps one kernel of The modern block the way ``tformer.nn.layers`` wraps the book's first kernels
(``forward`` keeps what ``backward`` needs; ``backward`` accumulates into ``grads``), and
``norm_layer`` picks LayerNorm or RMSNorm by name for the blocks and models.
"""
import numpy as np

from tformer.fast import linear as fast_linear
from tformer.fast import rmsnorm as fast_rmsnorm
from tformer.fast import swiglu as fast_swiglu
from tformer.nn.layers import Dropout, Embedding, LayerNorm, Linear, Module, _rng


class RMSNorm(Module):
    """y = γ ⊙ x / √(mean(x²) + ε) over the last axis; ``gamma = 1`` at init, no β."""

    saved = ("_cache",)

    def __init__(self, C, eps=1e-6, dtype=np.float32):
        super().__init__()
        self.eps = eps
        self.gamma = self.add_param("gamma", np.ones(C, dtype))
        self._cache = None

    def forward(self, x):
        y, self._cache = fast_rmsnorm.rmsnorm_forward(x, self.gamma, self.eps)
        return y

    def backward(self, dy):
        dx, dgamma = fast_rmsnorm.rmsnorm_backward(dy, self._cache)
        self.grads["gamma"] += dgamma
        return dx


NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


def norm_layer(norm, C, eps, dtype=np.float32):
    """``LayerNorm(C, eps)`` for ``norm="layernorm"``, ``RMSNorm(C, eps)`` for ``"rmsnorm"``."""
    if norm not in NORMS:
        raise ValueError(f"norm: expected one of {sorted(NORMS)}, got {norm!r}")
    return NORMS[norm](C, eps, dtype)


def swiglu_hidden(d_ff):
    """round(2 d_ff / 3): the SwiGLU width with the weights of a two-matrix FFN of width ``d_ff``.

    A SwiGLU network has three C × h matrices (W_a, W_b, W_2), a GELU or ReLU one two C × d_ff
    matrices; 3 C h = 2 C d_ff gives h = 2 d_ff / 3 (the rule of the LLaMA paper; for TinyGPT's
    d_ff = 4C, h = 8C/3). Rounding leaves the weight counts at most 1.5 C apart; the biases
    differ by 2h − d_ff ≈ d_ff/3.
    """
    if isinstance(d_ff, bool) or not isinstance(d_ff, (int, np.integer)) or d_ff < 2:
        raise ValueError(f"d_ff: expected an integer ≥ 2, got {d_ff!r}")
    return int(round(2 * d_ff / 3))


class SwiGLUFeedForward(Module):
    """FFN(x) = (silu(x W_a + b_a) ⊙ (x W_b + b_b)) W_2 + b_2, optional dropout before W_2.

    ``x: (B, T, C)`` -> ``(B, T, C)``; hidden width ``d_ff``. W_a (the gate) and W_b (the value)
    are the two halves of one ``fc1: (C, 2 d_ff)``, so both come from one product and their
    gradients go back through one. Three matrices instead of two: pass
    ``d_ff = swiglu_hidden(4 C)`` for the weights of TinyGPT's 4C GELU network.
    """

    saved = ("_cache",)

    def __init__(self, d_model, d_ff, bias=True, dropout=0.0, rng=None, dtype=np.float32,
                 init_std=None, seed=0):
        super().__init__()
        rng = _rng(rng, seed)
        self.d_ff = d_ff
        self.fc1 = Linear(d_model, 2 * d_ff, bias, rng, dtype, init_std)   # [W_a | W_b]
        self.drop = Dropout(dropout, rng)
        self.fc2 = Linear(d_ff, d_model, bias, rng, dtype, init_std)
        self._cache = None

    def forward(self, x):
        """x: (B, T, C) -> (B, T, C)."""
        h = self.fc1(x)                                                   # (B, T, 2 d_ff)
        g, self._cache = fast_swiglu.swiglu_forward(h[..., :self.d_ff], h[..., self.d_ff:])   # (B, T, d_ff)
        return self.fc2(self.drop(g))

    def backward(self, dy):
        """dy: (B, T, C) -> dx: (B, T, C); accumulates the gradients of fc1 and fc2."""
        dg = self.drop.backward(self.fc2.backward(dy))                   # (B, T, d_ff)
        dh = np.empty((*dg.shape[:-1], 2 * self.d_ff), dg.dtype)          # (B, T, 2 d_ff)
        fast_swiglu.swiglu_backward(dg, self._cache, out=(dh[..., :self.d_ff], dh[..., self.d_ff:]))
        return self.fc1.backward(dh)


class TiedLinear(Module):
    """Y = X Eᵀ + b: the linear layer whose weight is an embedding table ``E: (V, C)`` (weight tying).

    ``x: (..., C)`` -> ``(..., V)``. The layer registers the embedding's own parameter array and
    its own gradient array under ``W``, so both layers accumulate into one gradient,
    ∂L/∂E = (the lookup's scatter-add) + dYᵀ X, with no extra step. ``named_parameters`` lists
    the array under both names (as PyTorch's state dict does for tied weights);
    ``num_parameters``, ``flatten_parameters``, the optimizers and gradient clipping count it once.
    ``b: (V,)`` is the layer's own (zeros at init), or None with ``bias=False``.
    """

    saved = ("_cache",)

    def __init__(self, embedding, bias=True):
        super().__init__()
        if not isinstance(embedding, Embedding):
            raise TypeError(f"embedding: expected an Embedding, got {type(embedding).__name__}")
        E = embedding.params["W"]
        self.params["W"], self.grads["W"] = E, embedding.grads["W"]       # the same arrays, shared
        self.W = E          # what forward reads: flatten_parameters and MixedPrecision rebind it
        self.b = self.add_param("b", np.zeros(E.shape[0], E.dtype)) if bias else None
        self._cache = None

    def forward(self, x, out=None):
        """x: (..., C) -> (..., V); ``out``: an array to write the result into."""
        y, self._cache = fast_linear.linear_forward(x, self.W.T, self.b, out=out)    # X Eᵀ: Eᵀ is a view
        return y

    def backward(self, dy):
        """dy: (..., V) -> dx: (..., C); adds dEᵀ = Xᵀ dY into the shared gradient (and db), or,
        E frozen, db alone."""
        if self.is_frozen("W"):
            return self.backward_without_dW(dy)
        dx, _, _ = fast_linear.linear_backward(dy, self._cache, accumulate=(self.grads["W"].T, self.grads.get("b")))
        return dx

    def backward_without_dW(self, dy):
        """The backward pass with the tied weight frozen (``Module.freeze``): dX = dY E, and db if
        b is trained; dEᵀ = Xᵀ dY is never formed."""
        dx, _ = fast_linear.linear_backward_without_dW(dy, self._cache, accumulate=self.grads.get("b"),
                                                       bias=not self.is_frozen("b"))
        return dx
