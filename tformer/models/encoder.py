"""The post-LN encoder: a Transformer encoder trained to reconstruct its input, in NumPy.

    H_0 = X + PE[:T]                                   (B, T, d)   fixed sinusoidal table, no parameters
    Z_l = LN(H_{l-1} + MHA(H_{l-1}))                   (B, T, d)   multi-head, biases on W^Q, W^K, W^V, W^O
    H_l = LN(Z_l + FFN(Z_l)),  FFN(z) = max(0, z W_1 + b_1) W_2 + b_2          l = 1 .. n_layers
    Ŷ = O = H_{n_layers}                               (B, T, d)

The encoder's output is O of the last block: no LayerNorm or projection follows it. Its input
is already a float tensor X (no embedding), and the reconstruction task asks for Ŷ ≈ X under the
mean squared error ``L = ‖Ŷ − X‖² / (B·T·d)`` (``F.mse_loss``, reduction "mean").
"""
import numpy as np

from tformer.core.validate import attention_mask, sequences, upstream
from tformer.nn.blocks import PostNormBlock
from tformer.nn.layers import Module, ModuleList, SinusoidalPositions


class Encoder(Module):
    """O = Encoder(X): ``x: (B, T, d_model)`` floats -> ``O: (B, T, d_model)``.

    ``n_layers`` post-LN blocks (``tformer.nn.blocks.PostNormBlock``, ReLU FFN, biases) after the
    sinusoidal positions; ``max_len`` bounds T. ``backward(dO)`` accumulates every parameter's
    gradient and returns ``dX`` (the positional table is a constant, so dX = dH_0).

    Input checks, before any work: ``x`` must be a float array of 3 axes, of the model's dtype,
    with last axis d_model, B ≥ 1, 1 ≤ T ≤ max_len and no NaN or ±inf (``validate.sequences``);
    ``mask``, boolean (True = may attend) or additive float (−inf blocks; no NaN or +inf), must
    broadcast to the scores (B, H, T, T), e.g. a padding mask (B, 1, 1, T)
    (``validate.attention_mask``). Each failure is a ValueError or TypeError naming ``x`` or
    ``mask``. A query whose keys are all masked gets a zero attention output, not NaN.
    ``backward`` needs a forward pass first (RuntimeError) and ``dout`` of the output's shape and dtype.
    """

    def __init__(self, d_model=64, n_heads=4, n_layers=2, d_ff=256, max_len=512, dropout=0.0,
                 eps=1e-5, seed=0, dtype=np.float32):
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads), ("n_layers", n_layers),
                            ("d_ff", d_ff), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if d_model % 2:
            raise ValueError(f"d_model: expected an even width (sin/cos pairs), got {d_model}")
        if d_model % n_heads:
            raise ValueError(f"n_heads: must divide d_model = {d_model}, got {n_heads}")
        self.config = dict(d_model=int(d_model), n_heads=int(n_heads), n_layers=int(n_layers),
                           d_ff=int(d_ff), max_len=int(max_len), dropout=float(dropout),
                           eps=float(eps), seed=int(seed), dtype=np.dtype(dtype).name)
        self.dtype = np.dtype(dtype)
        self.rng = np.random.default_rng(seed)
        self.pos = SinusoidalPositions(max_len, d_model, dtype)
        self.blocks = ModuleList(PostNormBlock(d_model, n_heads, d_ff, dropout=dropout, activation="relu",
                                               bias=True, rng=self.rng, dtype=dtype, eps=eps)
                                 for _ in range(n_layers))
        self._out = None                   # (shape, dtype) of the last forward output

    def forward(self, x, mask=None):
        """x: (B, T, d) -> O: (B, T, d). ``mask`` (optional) broadcasts to the scores (B, H, T, T)."""
        c = self.config
        sequences("x", x, c["d_model"], self.dtype)
        B, T, _ = x.shape                                # T > max_len: self.pos refuses it
        if mask is not None:
            attention_mask("mask", mask, (B, c["n_heads"], T, T))
        h = self.pos(x)                                  # H_0 = X + PE[:T]   (B, T, d)
        for block in self.blocks:
            h = block(h, mask)                           # H_l = LN(Z_l + FFN(Z_l))   (B, T, d)
        self._out = (h.shape, h.dtype)
        return h                                         # Ŷ = O of the last block

    def backward(self, dout):
        """dout = ∂L/∂O: (B, T, d) -> ∂L/∂X: (B, T, d); accumulates into every ``grads``."""
        upstream("dout", dout, self._out)
        dh = dout
        for block in reversed(self.blocks):
            dh = block.backward(dh)                      # ∂L/∂H_{l-1}
        return self.pos.backward(dh)                     # PE is a constant: ∂H_0/∂X = I

    def attention_maps(self):
        """The attention probabilities of the last forward pass, one ``(B, H, T, T)`` array per layer."""
        return [block.attn.att for block in self.blocks]
