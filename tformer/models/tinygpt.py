"""Seed 004: TinyGPT, a byte-level decoder-only Transformer (pre-norm, causal, fused W_qkv, GELU).

    X = W_te[tokens] + W_pe[:T]                      (B, T, C)
    X ← X + Attn(LN(X));  X ← X + MLP(LN(X))         n_layers times
    Z = LN(X) W_lm + b_lm                            (B, T, V)

The seed's attention is single-head "for now"; ``n_heads > 1`` gives the multi-head version.
"""
import numpy as np

from .._validate import int_array
from ..blocks import PreNormBlock
from ..layers import Embedding, LayerNorm, Linear, Module, ModuleList


class TinyGPT(Module):
    """logits = TinyGPT(tokens): ``tokens: (B, T)`` ints in [0, 256) -> ``logits: (B, T, V)``."""

    def __init__(self, d_model=64, n_heads=1, n_layers=2, max_len=64, vocab_size=256, d_ff=None,
                 dropout=0.0, seed=0, dtype=np.float32):
        super().__init__()
        self.config = dict(d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_len=max_len,
                           vocab_size=vocab_size, d_ff=d_ff or 4 * d_model, dropout=dropout,
                           dtype=np.dtype(dtype).name)
        self.rng = np.random.default_rng(seed)
        C = d_model
        self.wte = Embedding(vocab_size, C, self.rng, dtype, init_std=0.02)
        self.wpe = Embedding(max_len, C, self.rng, dtype, init_std=0.02)
        self.blocks = ModuleList(PreNormBlock(C, n_heads, d_ff or 4 * C, dropout=dropout, rng=self.rng,
                                              dtype=dtype) for _ in range(n_layers))
        self.ln_f = LayerNorm(C, dtype=dtype)
        self.lm_head = Linear(C, vocab_size, True, self.rng, dtype, init_std=0.02)
        self.flatten_parameters()          # one flat buffer of parameters, one of gradients
        self.max_len = max_len
        self._positions = (0, 0)

    def forward(self, tokens, kv_caches=None):
        """tokens: (B, T) -> logits (B, T, V). With ``kv_caches`` (one per block, inference only) the
        tokens are the new positions that follow those already in the caches."""
        int_array("tokens", tokens, ndim=2)
        B, T = tokens.shape
        start = kv_caches[0].t if kv_caches else 0
        if start + T > self.max_len:
            raise ValueError(f"tokens: {start + T} positions exceed max_len = {self.max_len}")
        # W_pe[start:start+T] is the same (T, C) block for every sequence: it is added by
        # broadcasting instead of being gathered B times, and its gradient is a sum over the batch.
        x = self.wte(tokens)                                            # (B, T, C), a fresh gather
        x += self.wpe.W[start:start + T]                                # + W_pe[pos], (T, C)
        self._positions = (start, T)
        for i, block in enumerate(self.blocks):
            x = block(x, None, kv_caches[i] if kv_caches else None)   # (B, T, C)
        return self.lm_head(self.ln_f(x))                              # (B, T, V)

    def backward(self, dlogits):
        """dlogits: (B, T, V) -> None (tokens have no gradient); accumulates every parameter's gradient."""
        dx = self.ln_f.backward(self.lm_head.backward(dlogits))        # (B, T, C)
        for block in reversed(self.blocks._items):
            dx = block.backward(dx)
        self.wte.backward(dx)
        start, T = self._positions
        self.wpe.grads["W"][start:start + T] += dx.sum(axis=0)         # Σ_b dX[b], (T, C)
        return None

    def new_kv_caches(self, B):
        """One empty KV cache per block, for ``B`` sequences of up to ``max_len`` positions."""
        return [blk.attn.new_cache(B, self.max_len) for blk in self.blocks]
