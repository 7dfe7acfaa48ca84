"""TinyGPT, a byte-level decoder-only Transformer (pre-norm, causal, fused W_qkv, GELU).

    X = W_te[tokens] + W_pe[:T]                      (B, T, C)
    X ← X + Attn(LN(X));  X ← X + MLP(LN(X))         n_layers times
    Z = LN(X) W_lm + b_lm                            (B, T, V)

The C++ program it reproduces has single-head attention "for now"; ``n_heads > 1`` gives the
multi-head version. The keywords of the modern block (the chapter "The modern block") change one
piece each; their defaults are TinyGPT's.
"""
import numpy as np

from tformer.fast import decode as fast_decode
from tformer.nn import functional as F
from tformer.core.validate import index_range, int_array
from tformer.nn.attention import check_attention
from tformer.nn.blocks import BlockStack, PostNormGPTBlock, PreNormBlock, modern_parts
from tformer.nn.layers import Embedding, Linear, Module
from tformer.nn.modern_layers import NORMS, TiedLinear, norm_layer
from tformer.nn.recompute import Recompute, check_checkpointing

POSITIONS = ("learned", "sinusoidal", "rope")
MLPS = ("gelu", "relu", "relu2", "swiglu")
NORM_POSITIONS = {"pre": PreNormBlock, "post": PostNormGPTBlock}


class TinyGPT(Module):
    """logits = TinyGPT(tokens): ``tokens: (B, T)`` ints in [0, 256) -> ``logits: (B, T, V)``.

    The modern block, one keyword per piece (each default is TinyGPT's):

    - ``norm``: ``"layernorm"`` or ``"rmsnorm"`` (every norm: both of each block and the final one;
      ε = 1e-5 for both kinds, so that only the normalisation changes).
    - ``positions``: ``"learned"`` (W_pe), ``"sinusoidal"`` (the fixed table of the complete
      Transformer and the post-LN encoder, added to the embeddings) or ``"rope"`` (no table: q and
      k are rotated in every attention layer).
    - ``mlp``: ``"gelu"``, ``"relu"``, ``"relu2"`` (ReLU squared, modded-nanogpt's) or ``"swiglu"``.
      The hidden width is ``d_ff`` (default 4C) for all four. SwiGLU has three C × d_ff matrices
      instead of two: to compare at the same parameter budget pass
      ``d_ff=swiglu_hidden(4 * d_model)``, i.e. 2/3 · 4C (``tformer.nn.modern_layers.swiglu_hidden``).
    - ``n_kv_heads``: key/value heads of grouped-query attention (default ``n_heads``: multi-head).
    - ``tie_embeddings``: the LM head's weight is W_teᵀ (``TiedLinear``, keeping its bias b_lm);
      W_te's gradient then sums its two uses.

    ``norm_position``: ``"pre"`` (TinyGPT: X ← X + f(N(X))) or ``"post"`` (the complete Transformer
    and the post-LN encoder: X ← N(X + f(X)), ``PostNormGPTBlock``; the final norm stays, so the
    parameters are the same arrays from the same seed). "Ablating the modern block" compares the
    two at a high learning rate.

    ``attention``: ``"plain"`` (the kernel of "Scaled dot-product attention", which stores the
    (B, H, T, T) probabilities) or ``"flash"`` (the online softmax of "Attention that never stores
    T × T": the same model and the same results up to rounding, in O(T) memory per head instead
    of O(T²)).

    ``gradient_checkpointing=True``: the stack of blocks is a ``tformer.nn.recompute.Recompute``
    ("Fitting in memory"): in training each segment of ``blocks_per_segment`` blocks keeps only its
    input and recomputes its forward pass during the backward; the same gradients bit for bit,
    less memory, one more forward pass of the blocks. ``forward`` and ``backward`` are the same
    either way.

    How the model is run is decided outside it: the batch cut across threads
    (``tformer.training.batch_threads.BatchCut``, which ``tformer.training.train`` wraps around it).
    Decoding runs this same forward with a KV cache (``forward(tokens, kv_cache)``, the caches from
    ``tformer.decoding.kv_cache.new_caches``), every layer with its own arithmetic.

    Everything is kept in ``model.config`` (and so in checkpoints), with ``d_ff`` and
    ``n_kv_heads`` resolved to numbers.
    """

    def __init__(self, d_model=64, n_heads=1, n_layers=2, max_len=64, vocab_size=256, d_ff=None,
                 dropout=0.0, seed=0, dtype=np.float32,
                 norm="layernorm", positions="learned", mlp="gelu", n_kv_heads=None, tie_embeddings=False,
                 attention="plain", norm_position="pre", gradient_checkpointing=False,
                 blocks_per_segment=1):
        super().__init__()
        gradient_checkpointing, blocks_per_segment = check_checkpointing(
            gradient_checkpointing, blocks_per_segment)
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        _check_modern(d_model, n_heads, norm, positions, mlp, n_kv_heads, tie_embeddings)
        if not isinstance(norm_position, str) or norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm_position: expected one of {list(NORM_POSITIONS)}, got {norm_position!r}")
        check_attention(attention)
        self.config = dict(d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_len=max_len,
                           vocab_size=vocab_size, d_ff=d_ff or 4 * d_model, dropout=dropout,
                           dtype=np.dtype(dtype).name,
                           norm=norm, positions=positions, mlp=mlp, n_kv_heads=int(n_kv_heads),
                           tie_embeddings=bool(tie_embeddings), attention=attention,
                           norm_position=norm_position,
                           gradient_checkpointing=gradient_checkpointing,
                           blocks_per_segment=blocks_per_segment)
        self.rng = np.random.default_rng(seed)
        C = d_model
        self.wte = Embedding(vocab_size, C, self.rng, dtype, init_std=0.02)
        self.wpe = Embedding(max_len, C, self.rng, dtype, init_std=0.02) if positions == "learned" else None
        self.pe = F.sinusoidal_positions(max_len, C, dtype) if positions == "sinusoidal" else None
        Block = NORM_POSITIONS[norm_position]
        parts = modern_parts(norm, n_kv_heads, positions == "rope", attention)
        blocks = [Block(C, n_heads, d_ff or 4 * C, activation=mlp, dropout=dropout, rng=self.rng,
                        dtype=dtype, parts=parts) for _ in range(n_layers)]
        self.blocks = (Recompute(blocks, blocks_per_segment) if gradient_checkpointing
                       else BlockStack(blocks))
        self.ln_f = norm_layer(norm, C, 1e-5, dtype)
        if tie_embeddings:
            self.lm_head = TiedLinear(self.wte, bias=True)
        else:
            self.lm_head = Linear(C, vocab_size, True, self.rng, dtype, init_std=0.02)
        self.flatten_parameters()          # one flat buffer of parameters, one of gradients
        self.max_len = max_len

    def forward(self, tokens, kv_cache=None):
        """tokens: (B, T) -> logits (B, T, V).

            X = W_te[tokens] + W_pe[s:s+T]              (B, T, C)
            X ← block_i(X)                              i = 1 … n_layers
            Z = LN_f(X) W_lm + b_lm                     (B, T, V)

        ``kv_cache`` (decoding): one ``KVCache`` per block (``tformer.decoding.kv_cache.new_caches``)
        holding the s positions seen so far (s = 0 without one); ``tokens`` are the T positions
        after them, and each attention layer reads the earlier keys and values from its cache and
        appends the new ones, keeping nothing for a backward pass. One new position a sequence
        (T = 1, eval mode) goes through the row paths (``rows``: each block's, then LN_f's and
        the head's) where the cache allows it and no kernel would split the step
        (``tformer.fast.decode.no_split``): the same bits in fewer Python calls.

        ``tokens`` must be an integer array (B, T) with B ≥ 1, T ≥ 1, s + T ≤ max_len and ids in
        [0, V), else ValueError or TypeError naming ``tokens`` (an empty batch has nothing to
        predict); a ``kv_cache`` without one cache per block raises ValueError.
        """
        s = 0 if kv_cache is None else cached_positions(kv_cache, len(self.blocks))
        check_tokens(tokens, self.max_len, self.config["vocab_size"], s)
        x = self.embed(tokens, s)                                       # (B, T, C)
        x = self.blocks(x, None, kv_cache)                              # (B, T, C)
        if kv_cache is not None and self._rows(x, kv_cache):           # one step: the row paths
            return self.lm_head.rows(self.ln_f.rows(x[:, 0]))[:, None]  # (B, 1, V)
        return self.lm_head(self.ln_f(x))                               # (B, T, V)

    def _rows(self, x, kv_cache):
        """Do LN_f and the head take their row paths on ``x: (B, T, C)``? Where the last block's
        cache allows it (the run, and a block with a row path), T = 1, in eval mode, both layers
        have one and no kernel would split the step."""
        B, T, C = x.shape
        cfg = self.config
        return (T == 1 and kv_cache[-1].lean and not self.training
                and hasattr(self.ln_f, "rows") and self.ln_f.gamma.dtype in fast_decode.DTYPES
                and hasattr(self.lm_head, "rows")
                and fast_decode.no_split(B, C, cfg["d_ff"], cfg["n_heads"]))

    def embed(self, tokens, start=0):
        """X = W_te[tokens] + W_pe[start:start+T]: (B, T) -> (B, T, C), a fresh array.

        W_pe[start:start+T] is the same (T, C) block for every sequence: it is added by
        broadcasting instead of being gathered B times (its gradient is a sum over the batch).
        ``start``: positions already in a KV cache (``tformer.decoding.kv_cache``)."""
        T = tokens.shape[1]
        x = self.wte(tokens)                                            # (B, T, C), a gather
        if self.wpe is not None:
            x += self.wpe.W[start:start + T]                            # + W_pe[pos], (T, C)
        elif self.pe is not None:
            x += self.pe[start:start + T]                               # + PE[pos], fixed
        return x

    def backward(self, dlogits):
        """dlogits: (B, T, V) -> None (tokens have no gradient); accumulates every parameter's
        gradient, the blocks in reverse order."""
        dx = self.ln_f.backward(self.lm_head.backward(dlogits))        # (B, T, C)
        dx = self.blocks.backward(dx)                                  # (B, T, C)
        # dW_te += the scatter-add of dX (tied: added to the head's (HᵀdZ)ᵀ, already in dW_te)
        self.wte.backward(dx)
        if self.wpe is not None:
            self.wpe.grads["W"][:dx.shape[1]] += dx.sum(axis=0)        # Σ_b dX[b], (T, C)
        return None


def cached_positions(kv_cache, n_blocks):
    """The positions a model's ``kv_cache`` (one KVCache per block) holds, checked to be one
    cache per block (ValueError naming ``kv_cache``)."""
    if len(kv_cache) != n_blocks:
        raise ValueError(f"kv_cache: expected one per block ({n_blocks}), got {len(kv_cache)}")
    return kv_cache[0].t


def check_tokens(tokens, max_len, vocab_size, start=0):
    """A token model's input: integers (B, T), B ≥ 1, T ≥ 1, ``start + T ≤ max_len`` (``start``:
    positions already cached), ids in [0, V); ValueError or TypeError naming ``tokens``."""
    int_array("tokens", tokens, ndim=2)
    B, T = tokens.shape
    if B == 0 or T == 0:
        raise ValueError(f"tokens: expected at least one sequence (B ≥ 1) of at least one token "
                         f"(T ≥ 1), got shape {tokens.shape}")
    if start + T > max_len:
        raise ValueError(f"tokens: {start + T} positions exceed max_len = {max_len}")
    index_range("tokens", tokens, 0, vocab_size)                        # the embedding does not check


def _check_modern(d_model, n_heads, norm, positions, mlp, n_kv_heads, tie_embeddings):
    """The modern block's keywords, checked before anything is built."""
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1 \
            or d_model % n_heads:
        raise ValueError(f"n_heads: expected an integer ≥ 1 that divides d_model = {d_model}, got {n_heads!r}")
    for name, value, allowed in (("norm", norm, tuple(NORMS)), ("positions", positions, POSITIONS),
                                 ("mlp", mlp, MLPS)):
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"{name}: expected one of {list(allowed)}, got {value!r}")
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, (int, np.integer)):
        raise TypeError(f"n_kv_heads: expected an integer, got {type(n_kv_heads).__name__}")
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads: expected a divisor of n_heads = {n_heads}, got {n_kv_heads}")
    if not isinstance(tie_embeddings, (bool, np.bool_)):
        raise TypeError(f"tie_embeddings: expected True or False, got {tie_embeddings!r}")
    if positions == "rope" and (d_model // n_heads) % 2:
        raise ValueError(f"positions: 'rope' needs an even head size d_model / n_heads, "
                         f"got {d_model} / {n_heads} = {d_model // n_heads}")
    if positions == "sinusoidal" and d_model % 2:
        raise ValueError(f"positions: 'sinusoidal' needs an even d_model, got {d_model}")
