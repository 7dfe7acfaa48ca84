"""The two-layer transformer: two residual blocks, no LayerNorm, no biases.

For each layer l = 1, 2 (X_0 = X, Y = X_2):

    Q_l = X_{l-1} W_{q,l},  K_l = X_{l-1} W_{k,l},  V_l = X_{l-1} W_{v,l}       (B, T, d)
    A_l = softmax(Q_l K_lᵀ / √d),  Z_l = A_l V_l                               (B, T, T), (B, T, d)
    Z̃_l = Z_l W_{o,l} + X_{l-1}                                                (B, T, d)
    H_l = Z̃_l W_{1,l},  S'_l = H_l ⊙ σ(H_l)                                     (B, T, d_ff)
    X_l = S'_l W_{2,l} + Z̃_l                                                   (B, T, d)

trained with L = ½‖Y − Y_true‖² and AdamW with ε inside the square root. Each layer is a
``tformer.nn.blocks.ResidualBlock`` (single head, swish, ``bias=False``). The width of W_1 is a
free choice; here ``d_ff`` defaults to 4·d, the usual choice.
"""
import numpy as np

from tformer.core.validate import sequences, upstream
from tformer.nn.attention import MultiHeadAttention
from tformer.nn.blocks import ResidualBlock
from tformer.nn.layers import Module, ModuleList

# the equations' symbols (layer l = 1, 2) -> qualified parameter names of ``named_parameters()``
SYMBOLS = {f"{sym},{l}": f"blocks.{l - 1}.{name}" for l in (1, 2) for sym, name in
           (("W_q", "attn.q.W"), ("W_k", "attn.k.W"), ("W_v", "attn.v.W"), ("W_o", "attn.o.W"),
            ("W_1", "ffn.fc1.W"), ("W_2", "ffn.fc2.W"))}


class TwoLayerTransformer(Module):
    """Y = Block_2(Block_1(X)), Block(X) = X̃ + swish(X̃ W_1) W_2 with X̃ = X + Attn(X) W_o.

    ``x: (B, T, d_model)`` -> ``(B, T, d_model)``. Per layer: ``W_q, W_k, W_v, W_o: (d, d)``,
    ``W_1: (d, d_ff)``, ``W_2: (d_ff, d)``, drawn from U(−1/√d_in, 1/√d_in). With ``use_mlp=False``
    the MLP branches are left out (X_l = Z̃_l, parameters ``blocks.0.q.W`` …), an ablation for
    comparisons; the two-layer transformer has them.
    After a forward pass ``att`` holds ``[A_1, A_2]``, each ``(B, T, T)``.

    Input checks (``tformer.core.validate.sequences``): ``x`` must be a float array of 3 axes, of the
    weights' dtype, with last axis d_model, B ≥ 1, T ≥ 1 and no NaN or ±inf; else ValueError or
    TypeError naming ``x``. No positional table: any T ≥ 1 is accepted. ``backward`` needs a
    forward pass first (RuntimeError) and ``dy`` of the output's shape and dtype.
    """

    def __init__(self, d_model=16, d_ff=None, use_mlp=True, seed=0, dtype=np.float32):
        super().__init__()
        if not isinstance(d_model, (int, np.integer)) or d_model < 1:
            raise ValueError(f"d_model: expected a positive integer, got {d_model!r}")
        d_ff = 4 * d_model if d_ff is None else d_ff
        if not isinstance(d_ff, (int, np.integer)) or d_ff < 1:
            raise ValueError(f"d_ff: expected a positive integer, got {d_ff!r}")
        self.config = dict(d_model=int(d_model), d_ff=int(d_ff), use_mlp=bool(use_mlp), seed=seed,
                           dtype=np.dtype(dtype).name)
        self.use_mlp = bool(use_mlp)
        rng = np.random.default_rng(seed)
        if self.use_mlp:
            blocks = (ResidualBlock(d_model, n_heads=1, d_ff=d_ff, activation="swish", bias=False,
                                    rng=rng, dtype=dtype) for _ in range(2))
        else:                           # the attention half of each block only
            blocks = (MultiHeadAttention(d_model, n_heads=1, bias=False, rng=rng, dtype=dtype)
                      for _ in range(2))
        self.blocks = ModuleList(blocks)
        self._out = None                   # (shape, dtype) of the last forward output

    @property
    def att(self):
        """[A_1, A_2] of the last forward pass, each ``(B, T, T)``."""
        attns = [b.attn if self.use_mlp else b for b in self.blocks]
        return [None if a.att is None else a.att[:, 0] for a in attns]

    def forward(self, x):
        """x: (B, T, d_model) -> Y: (B, T, d_model)."""
        first = self.blocks[0].attn if self.use_mlp else self.blocks[0]
        sequences("x", x, self.config["d_model"], first.q.W.dtype)
        for blk in self.blocks:
            if self.use_mlp:
                x = blk(x)                                   # X_l = S'_l W_2 + Z̃_l
            else:
                x = x + blk(x)                               # X_l = Z_l W_o + X_{l-1}
        self._out = (x.shape, x.dtype)
        return x

    def backward(self, dy):
        """dy = ∂L/∂Y: (B, T, d_model) -> ∂L/∂X; accumulates every W's gradient, layer 2 first."""
        upstream("dy", dy, self._out)
        for blk in reversed(self.blocks):
            dy = blk.backward(dy) if self.use_mlp else dy + blk.backward(dy)
        return dy
