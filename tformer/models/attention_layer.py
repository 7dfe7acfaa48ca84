"""The single attention layer: one self-attention layer, no biases, no residual.

    Q = X W_q,  K = X W_k,  V = X W_v                 (B, T, d)
    A = softmax(Q Kᵀ / √d_model)                      (B, T, T)
    Y = A V W_o                                       (B, T, d)

trained with L = ½‖Y − Y_true‖² (so ∂L/∂Y = Y − Y_true) and AdamW with ε inside the square root.
The layer is ``tformer.nn.attention.MultiHeadAttention`` with one head and no biases: with H = 1 the
head size is D = d_model, so its default scale 1/√D is the layer's 1/√d_model.
"""
import numpy as np

from tformer.core.validate import sequences, upstream
from tformer.nn.attention import MultiHeadAttention
from tformer.nn.layers import Module

# the layer's symbols -> qualified parameter names of ``named_parameters()``
SYMBOLS = {"W_q": "attn.q.W", "W_k": "attn.k.W", "W_v": "attn.v.W", "W_o": "attn.o.W"}


class AttentionLayer(Module):
    """Y = softmax(X W_q (X W_k)ᵀ / √d_model) X W_v W_o:  ``x: (B, T, d_model)`` -> ``(B, T, d_model)``.

    Parameters ``W_q, W_k, W_v, W_o: (d_model, d_model)`` (``attn.q.W`` … ``attn.o.W``), drawn from
    U(−1/√d_model, 1/√d_model), or N(0, init_std²) when ``init_std`` is given. After a forward pass
    ``att`` holds the attention probabilities A, ``(B, T, T)``.

    Input checks (``tformer.core.validate.sequences``): ``x`` must be a float array of 3 axes, of the
    weights' dtype, with last axis d_model, B ≥ 1, T ≥ 1 and no NaN or ±inf; else ValueError or
    TypeError naming ``x``. There is no positional table, so any T ≥ 1 is accepted (the scores
    are (B, T, T): memory grows as T²). ``backward`` needs a forward pass first (RuntimeError) and
    ``dy`` of the output's shape and dtype.
    """

    def __init__(self, d_model=16, init_std=None, seed=0, dtype=np.float32):
        super().__init__()
        if not isinstance(d_model, (int, np.integer)) or d_model < 1:
            raise ValueError(f"d_model: expected a positive integer, got {d_model!r}")
        self.config = dict(d_model=int(d_model), init_std=init_std, seed=seed,
                           dtype=np.dtype(dtype).name)
        self.attn = MultiHeadAttention(d_model, n_heads=1, bias=False, scale=None,
                                       rng=np.random.default_rng(seed), dtype=dtype,
                                       init_std=init_std)
        self._out = None                   # (shape, dtype) of the last forward output

    # the equation's names for the four matrices (views of the parameters, not copies)
    W_q = property(lambda self: self.attn.q.W)
    W_k = property(lambda self: self.attn.k.W)
    W_v = property(lambda self: self.attn.v.W)
    W_o = property(lambda self: self.attn.o.W)

    @property
    def att(self):
        """A = softmax(Q Kᵀ / √d_model) of the last forward pass, ``(B, T, T)`` (None before one)."""
        return None if self.attn.att is None else self.attn.att[:, 0]        # (B, T, T)

    def forward(self, x):
        """x: (B, T, d_model) -> Y: (B, T, d_model)."""
        sequences("x", x, self.config["d_model"], self.W_q.dtype)
        y = self.attn(x)
        self._out = (y.shape, y.dtype)
        return y

    def backward(self, dy):
        """dy = ∂L/∂Y: (B, T, d_model) -> ∂L/∂X; accumulates ∂L/∂W_q, ∂L/∂W_k, ∂L/∂W_v, ∂L/∂W_o."""
        upstream("dy", dy, self._out)
        return self.attn.backward(dy)
