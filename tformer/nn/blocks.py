"""Transformer blocks: the three residual wirings of the book's systems.

- ``ResidualBlock`` (the two-layer transformer): X̃ = X + MHA(X),  Y = X̃ + FFN(X̃);
  no normalisation.
- ``PostNormBlock`` (the complete Transformer, the post-LN encoder): Z = LN(X + MHA(X)),
  O = LN(Z + FFN(Z)).
- ``PreNormBlock`` (TinyGPT): X ← X + MHA(LN(X)),  X ← X + FFN(LN(X)).
- ``PostNormGPTBlock`` ("Ablating the modern block"): TinyGPT's block with the norms moved after
  the residual sums, X ← LN(X + MHA(X)),  X ← LN(X + FFN(X)): the post-norm wiring of the
  complete Transformer and the post-LN encoder, with every option of the modern block and the
  KV cache.
- ``BlockStack``: the blocks of a model in order, X ← block_i(X) for i = 1 … L, as one module
  (``tformer.nn.recompute.Recompute`` stands in for it with gradient checkpointing); decoding
  hands block i the KV cache i.

Shapes: ``x: (B, T, C)`` -> ``(B, T, C)``. Each residual sum sends its gradient down both paths,
so every backward adds the branch's input gradient to the skip connection's.

A ``PreNormBlock`` handed a KV cache with one new position a sequence computes the same block
through its layers' row paths (``rows``: the same NumPy calls on the same arrays in a fraction of
the Python calls, ``tformer.fast.decode``) where every layer has one and no kernel would split
the step; the model's forward is the same either way.
"""
from typing import Callable, NamedTuple

import numpy as np

from tformer.fast import decode as fast_decode
from tformer.nn.attention import MultiHeadAttention
from tformer.nn.layers import Dropout, FeedForward, LayerNorm, Module, ModuleList, _rng
from tformer.nn.modern_layers import SwiGLUFeedForward, norm_layer


class BlockParts(NamedTuple):
    """The layer classes of a pre-norm block: ``norm(C, eps, dtype)``, ``attention(C, H, **kw)``,
    ``ffn(C, d_ff, activation, bias, **kw)``."""
    norm: Callable
    attention: Callable
    ffn: Callable


TINYGPT_PARTS = BlockParts(LayerNorm, MultiHeadAttention, FeedForward)


def modern_parts(norm="layernorm", n_kv_heads=None, rope=False, attention="plain"):
    """The modern block's layer classes (The modern block): ``norm`` ("layernorm" or "rmsnorm")
    for both norms; attention with ``n_kv_heads`` key/value heads (grouped-query), rotary
    positions (``rope``) and the ``attention`` kernel ("plain" or "flash", the online softmax);
    an ``activation="swiglu"`` feed-forward network is a SwiGLU one of width ``d_ff``."""
    def make_norm(C, eps, dtype):
        return norm_layer(norm, C, eps, dtype)

    def make_attention(C, H, **kw):
        return MultiHeadAttention(C, H, n_kv_heads=n_kv_heads, rope=rope, attention=attention, **kw)

    def make_ffn(C, d_ff, activation, bias, **kw):
        if activation == "swiglu":
            return SwiGLUFeedForward(C, d_ff, bias, **kw)
        return FeedForward(C, d_ff, activation, bias, **kw)
    return BlockParts(make_norm, make_attention, make_ffn)


class ResidualBlock(Module):
    """X̃ = X + MHA(X),  Y = X̃ + FFN(X̃)  (the two-layer transformer: single head,
    swish, no biases, no LayerNorm)."""

    def __init__(self, d_model, n_heads=1, d_ff=None, activation="swish", bias=False, rng=None,
                 dtype=np.float32, seed=0):
        super().__init__()
        rng = _rng(rng, seed)
        self.attn = MultiHeadAttention(d_model, n_heads, bias=bias, rng=rng, dtype=dtype)
        self.ffn = FeedForward(d_model, d_ff or 4 * d_model, activation, bias, rng=rng, dtype=dtype)

    def forward(self, x, mask=None):
        z = x + self.attn(x, mask)                 # X̃ = X + Z W_o
        return z + self.ffn(z)                     # Y = S' W_2 + X̃

    def backward(self, dy):
        dz = dy + self.ffn.backward(dy)            # ∂L/∂X̃ = ∂L/∂Y + (∂L/∂H) W_1ᵀ
        return dz + self.attn.backward(dz)         # ∂L/∂X = ∂L/∂X̃ + (Q, K, V paths)


class PostNormBlock(Module):
    """Z = LN(X + Drop(MHA(X))),  O = LN(Z + Drop(FFN(Z)))  (the complete Transformer, the
    post-LN encoder).

    ``attention="flash"``: the online-softmax kernel ("Attention that never stores T × T") instead
    of the plain one."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, activation="relu", bias=True,
                 causal=False, rng=None, dtype=np.float32, eps=1e-5, seed=0, attention="plain"):
        super().__init__()
        rng = _rng(rng, seed)
        self.attn = MultiHeadAttention(d_model, n_heads, bias=bias, causal=causal, rng=rng, dtype=dtype,
                                       attention=attention)
        self.drop1 = Dropout(dropout, rng)
        self.ln1 = LayerNorm(d_model, eps, dtype)
        self.ffn = FeedForward(d_model, d_ff, activation, bias, rng=rng, dtype=dtype)
        self.drop2 = Dropout(dropout, rng)
        self.ln2 = LayerNorm(d_model, eps, dtype)

    def forward(self, x, mask=None):
        z = self.ln1(x + self.drop1(self.attn(x, mask)))           # (B, T, C)
        return self.ln2(z + self.drop2(self.ffn(z)))               # (B, T, C)

    def backward(self, dy):
        da = self.ln2.backward(dy)                                 # ∂L/∂(Z + FFN(Z))
        dz = da + self.ffn.backward(self.drop2.backward(da))
        db = self.ln1.backward(dz)                                 # ∂L/∂(X + MHA(X))
        return db + self.attn.backward(self.drop1.backward(db))


class PreNormBlock(Module):
    """X ← X + MHA(LN(X)),  X ← X + FFN(LN(X))  (TinyGPT: causal, fused W_qkv, GELU MLP, biases).

    ``parts``: the classes of its norms, attention and feed-forward network, by default TinyGPT's
    (``LayerNorm``, ``MultiHeadAttention``, ``FeedForward``); ``modern_parts(...)`` gives those
    of the modern block (RMSNorm, grouped-query attention, RoPE, SwiGLU, the online softmax).
    """

    def __init__(self, d_model, n_heads=1, d_ff=None, activation="gelu", bias=True, causal=True,
                 fused_qkv=True, dropout=0.0, rng=None, dtype=np.float32, init_std=0.02, eps=1e-5,
                 seed=0, parts=None):
        super().__init__()
        rng = _rng(rng, seed)
        norm, attention, ffn = parts or TINYGPT_PARTS
        self.ln1 = norm(d_model, eps, dtype)
        self.attn = attention(d_model, n_heads, bias=bias, fused_qkv=fused_qkv, causal=causal,
                              rng=rng, dtype=dtype, init_std=init_std)
        self.drop1 = Dropout(dropout, rng)
        self.ln2 = norm(d_model, eps, dtype)
        self.d_ff = d_ff or 4 * d_model
        self.ffn = ffn(d_model, self.d_ff, activation, bias, rng=rng, dtype=dtype, init_std=init_std)
        self.drop2 = Dropout(dropout, rng)

    def forward(self, x, mask=None, kv_cache=None):
        # One new position a sequence, in eval mode, below the size a kernel splits across threads:
        # the same block by its layers' row paths, the same bits in a fraction of the Python calls.
        if (kv_cache is not None and kv_cache.lean and x.shape[1] == 1 and mask is None
                and not self.training
                and fast_decode.no_split(x.shape[0], x.shape[2], self.d_ff, self.attn.n_heads)):
            return self.rows(x[:, 0], kv_cache)[:, None]               # (B, 1, C): one step
        # Each branch returns a fresh array that nothing else holds (the output of W_o or W_2, or
        # dropout's product), so the residual sum is added into it in place: one array fewer per sum.
        h = self.drop1(self.attn(self.ln1(x), mask, kv_cache))         # (B, T, C)
        h += x                                                          # X + MHA(LN(X))
        out = self.drop2(self.ffn(self.ln2(h)))                         # (B, T, C)
        out += h                                                        # X + FFN(LN(X))
        return out

    def rows(self, x, kv_cache):
        """``forward`` on the rows ``x: (B, C)`` of one decoding step (one new position a
        sequence, eval: no dropout) -> (B, C), each layer by its row path; ``kv_cache`` gets the
        new keys and values. Taken by ``forward`` where the cache allows it (``KVCache.lean``,
        set from ``takes_rows()``) and no kernel would split the step (``fast.decode.no_split``)."""
        h = self.attn.rows(self.ln1.rows(x), kv_cache)                 # (B, C), fresh
        h += x                                                          # X + MHA(LN(X))
        out = self.ffn.rows(self.ln2.rows(h))                           # (B, C), fresh
        out += h                                                        # X + FFN(LN(X))
        return out

    def takes_rows(self):
        """True when every layer has the row path ``rows`` uses: LayerNorm norms in float32 or
        float64, attention with ``takes_rows()``, a GELU (tanh) feed-forward network whose two
        linear maps have ``rows`` (a float, int8 or LoRA layer)."""
        a, f = self.attn, self.ffn
        return (type(self.ln1) is LayerNorm and type(self.ln2) is LayerNorm
                and self.ln1.gamma.dtype in fast_decode.DTYPES
                and isinstance(a, MultiHeadAttention) and a.takes_rows()
                and type(f) is FeedForward and f.act.name == "gelu"
                and hasattr(f.fc1, "rows") and hasattr(f.fc2, "rows"))

    def backward(self, dy):
        # The norm's backward returns a fresh array, so each residual gradient is added into it.
        dx = self.ln2.backward(self.ffn.backward(self.drop2.backward(dy)))
        dx += dy                                                        # dX of X + FFN(LN(X))
        dx_in = self.ln1.backward(self.attn.backward(self.drop1.backward(dx)))
        dx_in += dx                                                     # dX of X + MHA(LN(X))
        return dx_in


class PostNormGPTBlock(PreNormBlock):
    """Z = N₁(X + MHA(X)),  O = N₂(Z + FFN(Z)): ``PreNormBlock`` with its norms after the sums.

    The same layers, created in the same order (the same parameters from the same seed), and the
    same keywords (``parts``, activation, KV cache); only the wiring moves.
    Every path from the input to the output now crosses 2 norms per block: no identity path
    remains, which is what makes the post-norm Transformer need its learning-rate warm-up.
    """

    def takes_rows(self):
        """False: a step of the post-norm wiring runs the general layers."""
        return False

    def rows(self, x, kv_cache):
        raise NotImplementedError("PostNormGPTBlock: no row path (takes_rows() is False)")

    def forward(self, x, mask=None, kv_cache=None):
        h = self.drop1(self.attn(x, mask, kv_cache))                   # (B, T, C), fresh
        h += x                                                          # X + MHA(X)
        z = self.ln1(h)                                                 # Z = N₁(X + MHA(X))
        out = self.drop2(self.ffn(z))                                   # (B, T, C), fresh
        out += z                                                        # Z + FFN(Z)
        return self.ln2(out)                                            # O = N₂(Z + FFN(Z))

    def backward(self, dy):
        da = self.ln2.backward(dy)                                      # ∂L/∂(Z + FFN(Z))
        dz = self.ffn.backward(self.drop2.backward(da)) + da            # ∂L/∂Z: branch + skip
        db = self.ln1.backward(dz)                                      # ∂L/∂(X + MHA(X))
        return self.attn.backward(self.drop1.backward(db)) + db         # ∂L/∂X: branch + skip


class BlockStack(ModuleList):
    """X ← block_i(X) for i = 1 … L; backward: dX ← block_iᵀ(dX) for i = L … 1.

    ``x: (B, T, C)`` -> ``(B, T, C)``; ``mask`` (a padding mask) goes to every block,
    ``kv_cache`` (decoding: one KV cache per block) the i-th cache to block i. The blocks are
    children ``0`` … ``L−1``, so parameter names read ``blocks.0.ln1.gamma``.
    """

    def forward(self, x, mask=None, kv_cache=None):
        if kv_cache is None:
            for block in self._items:
                x = block(x, mask)                                      # (B, T, C)
            return x
        for block, cache in zip(self._items, kv_cache):
            x = block(x, mask, cache)                                   # (B, T, C), cache extended
        return x

    def backward(self, dy):
        for block in reversed(self._items):
            dy = block.backward(dy)                                     # (B, T, C)
        return dy
