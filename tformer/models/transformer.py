"""The complete Transformer: a decoder-only language model (post-norm, ReLU), not Vaswani et al.'s
encoder–decoder.

    X⁰ = Drop(E[tokens] · √C + PE[:T])               (B, T, C)   embedding, sinusoidal positions
    Z  = LN(X + Drop(MHA(X; M)))                      (B, T, C)   } one post-norm block,
    X' = LN(Z + Drop(FFN(Z))),  FFN(z) = max(0, z W₁ + b₁) W₂ + b₂  } n_layers times
    logits = LN_f(Xᴺ) W_out + b_out                   (B, T, V)   final LayerNorm, vocabulary projection

The mask M lets position i attend to key j only if j ≤ i (causal) and token j is not padding
(``create_padding_mask(tokens, pad_idx)``): the two boolean masks are combined with AND inside
each attention layer. The embedding is multiplied by √C, as in Vaswani et al. §3.4, and drawn
from N(0, 1/C), so that E·√C has unit variance, the same scale as the positional table (the
system's description leaves it open; ``scale_embedding=False`` turns the factor off, with N(0, 1)
entries instead).

One generator, ``self.rng``, initialises every weight and drives every dropout layer, so that a
checkpoint (which stores ``model.rng``'s state) resumes a run bit for bit.
"""
import numpy as np

from tformer.nn import functional as F
from tformer.core.validate import attention_mask, index_range, token_batch, upstream
from tformer.nn.attention import check_attention
from tformer.nn.blocks import BlockStack, PostNormBlock
from tformer.nn.layers import Dropout, Embedding, LayerNorm, Linear, Module, SinusoidalPositions
from tformer.nn.recompute import Recompute, check_checkpointing


def parameter_count(vocab_size, d_model, n_layers, d_ff):
    """P = 2VC + V  +  N·(4C² + 4C  +  2C·d_ff + d_ff + C  +  4C)  +  2C  (the heads H do not matter).

    Embedding VC and projection CV + V (untied); per block the four attention projections with
    biases, the two FFN layers with biases and two LayerNorms (γ, β); the final LayerNorm.
    """
    V, C, N, d = vocab_size, d_model, n_layers, d_ff
    per_block = (4 * C * C + 4 * C) + (2 * C * d + d + C) + 4 * C
    return V * C + N * per_block + 2 * C + (C * V + V)


class Transformer(Module):
    """logits = Transformer(tokens): ``tokens: (B, T)`` ints in [0, V) -> ``logits: (B, T, V)``.

    Keyword arguments, with their defaults: ``Transformer(vocab_size=10000, d_model=512, n_heads=8,
    n_layers=6, d_ff=2048, max_len=5000, dropout=0.1)``. ``pad_idx`` is the padding token (its
    keys are masked out; ``None`` for no padding mask). Children: ``embed``, ``pos``, ``drop``,
    ``blocks`` (``PostNormBlock(causal=True)``), ``ln_f``, ``proj``. ``attention="flash"``: every
    block computes its attention by the online softmax ("Attention that never stores T × T"), the
    padding mask read tile by tile instead of combined with the causal mask into a (B, 1, T, T)
    array.
    """

    def __init__(self, vocab_size, d_model=512, n_heads=8, n_layers=6, d_ff=2048, max_len=5000,
                 dropout=0.1, seed=0, dtype=np.float32, pad_idx=0, scale_embedding=True,
                 attention="plain", gradient_checkpointing=False, blocks_per_segment=1):
        super().__init__()
        check_attention(attention)
        gradient_checkpointing, blocks_per_segment = check_checkpointing(
            gradient_checkpointing, blocks_per_segment)
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("n_heads", n_heads),
                            ("n_layers", n_layers), ("d_ff", d_ff), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if d_model % n_heads or d_model % 2:
            raise ValueError(f"d_model: expected an even multiple of n_heads = {n_heads}, got {d_model}")
        if pad_idx is not None and not 0 <= pad_idx < vocab_size:
            raise ValueError(f"pad_idx: expected None or an id in [0, {vocab_size}), got {pad_idx}")
        self.config = dict(vocab_size=int(vocab_size), d_model=int(d_model), n_heads=int(n_heads),
                           n_layers=int(n_layers), d_ff=int(d_ff), max_len=int(max_len),
                           dropout=float(dropout), seed=int(seed), dtype=np.dtype(dtype).name,
                           pad_idx=pad_idx, scale_embedding=bool(scale_embedding), attention=attention,
                           gradient_checkpointing=gradient_checkpointing,
                           blocks_per_segment=blocks_per_segment)
        self.rng = np.random.default_rng(seed)
        C = d_model
        self.emb_scale = float(np.sqrt(C)) if scale_embedding else 1.0
        self.embed = Embedding(vocab_size, C, self.rng, dtype, init_std=1.0 / self.emb_scale)
        self.pos = SinusoidalPositions(max_len, C, dtype)
        self.drop = Dropout(dropout, self.rng)
        blocks = [PostNormBlock(C, n_heads, d_ff, dropout=dropout, activation="relu", bias=True,
                                causal=True, rng=self.rng, dtype=dtype, attention=attention)
                  for _ in range(n_layers)]
        # gradient checkpointing: a stack that keeps only its segments' inputs (Fitting in memory)
        self.blocks = (Recompute(blocks, blocks_per_segment) if gradient_checkpointing
                       else BlockStack(blocks))
        self.ln_f = LayerNorm(C, dtype=dtype)
        self.proj = Linear(C, vocab_size, True, self.rng, dtype)
        self.flatten_parameters()          # one flat buffer of parameters, one of gradients
        self.vocab_size, self.max_len, self.pad_idx = vocab_size, max_len, pad_idx
        self._out = None                   # (shape, dtype) of the last forward output

    def forward(self, tokens, padding_mask=None):
        """tokens: (B, T) -> logits (B, T, V).

        ``padding_mask``: boolean, broadcastable to ``(B, 1, 1, T)``, True where a key may be
        attended to; by default ``create_padding_mask(tokens, pad_idx)`` (no mask if pad_idx is None).
        The causal mask is always applied on top of it.

            X⁰ = Drop(E[tokens] · √C + PE[:T]),  X ← block(X; M) n_layers times,
            logits = LN_f(X) W_out + b_out
        """
        padding_mask = self._check_input(tokens, padding_mask)
        x = self.embed(tokens)                                                   # (B, T, C)
        if self.emb_scale != 1.0:
            x *= self.emb_scale                                                  # E · √C
        x = self.drop(self.pos(x))                                               # (B, T, C)
        x = self.blocks(x, padding_mask)                                         # (B, T, C)
        logits = self.proj(self.ln_f(x))                                         # (B, T, V)
        self._out = (logits.shape, logits.dtype)
        return logits

    def _check_input(self, tokens, padding_mask):
        """``forward``'s checks, before any work (``tformer.core.validate``); returns the padding mask
        to apply (the given one or pad_idx's).

        ``tokens`` must be an integer array (B, T) with B ≥ 1 and 1 ≤ T ≤ max_len (``token_batch``;
        an empty batch has nothing to predict), with ids in [0, V); a given ``padding_mask`` must be
        boolean and broadcast to the scores (B, H, T, T) (``attention_mask``). Each failure is a
        ValueError or TypeError naming ``tokens`` or ``padding_mask``. A row of padding only gets
        zero attention outputs (every key masked), so finite logits, never NaN."""
        token_batch("tokens", tokens, self.max_len)
        index_range("tokens", tokens, 0, self.vocab_size)          # the embedding does not check
        B, T = tokens.shape
        if padding_mask is not None:
            attention_mask("padding_mask", padding_mask, (B, self.config["n_heads"], T, T),
                           additive=False)
        elif self.pad_idx is not None:
            padding_mask = F.create_padding_mask(tokens, self.pad_idx)          # (B, 1, 1, T)
        return padding_mask

    def backward(self, dlogits):
        """dlogits: (B, T, V) -> None (tokens have no gradient); accumulates every parameter's
        gradient, layer by layer in reverse."""
        upstream("dlogits", dlogits, self._out)
        dx = self.ln_f.backward(self.proj.backward(dlogits))                     # (B, T, C)
        dx = self.blocks.backward(dx)                                            # (B, T, C)
        dx = self.pos.backward(self.drop.backward(dx))                           # PE is a constant
        if self.emb_scale != 1.0:
            dx = dx * self.emb_scale                                             # ∂(E·√C)/∂E = √C
        self.embed.backward(dx)
        return None

    def count_parameters(self):
        """``parameter_count`` of this configuration (equals ``num_parameters()``)."""
        c = self.config
        return parameter_count(c["vocab_size"], c["d_model"], c["n_layers"], c["d_ff"])
