"""TinyGPT, a byte-level decoder-only Transformer (pre-norm, causal, fused W_qkv, GELU).

    X = W_te[tokens] + W_pe[:T]                      (B, T, C)
    X ← X + Attn(LN(X));  X ← X + MLP(LN(X))         n_layers times
    Z = LN(X) W_lm + b_lm                            (B, T, V)

The C++ program it reproduces has single-head attention "for now"; ``n_heads > 1`` gives the
multi-head version. The keywords of the modern block (the chapter "The modern block") change one
piece each; their defaults are TinyGPT's.
"""
import numpy as np

from .. import functional as F
from .._validate import index_range, int_array
from ..fast import decode
from ..attention import check_attention
from ..blocks import PostNormGPTBlock, PreNormBlock, modern_parts
from ..layers import Embedding, Linear, Module, ModuleList
from ..modern_layers import NORMS, TiedLinear, norm_layer
from ..scaling.recompute import Recompute, check_checkpointing
from ..scaling.batch_threads import Replicas

POSITIONS = ("learned", "sinusoidal", "rope")
MLPS = ("gelu", "relu", "swiglu")
NORM_POSITIONS = {"pre": PreNormBlock, "post": PostNormGPTBlock}


class TinyGPT(Module):
    """logits = TinyGPT(tokens): ``tokens: (B, T)`` ints in [0, 256) -> ``logits: (B, T, V)``.

    The modern block, one keyword per piece (each default is TinyGPT's):

    - ``norm``: ``"layernorm"`` or ``"rmsnorm"`` (every norm: both of each block and the final one;
      ε = 1e-5 for both kinds, so that only the normalisation changes).
    - ``positions``: ``"learned"`` (W_pe), ``"sinusoidal"`` (the fixed table of the complete
      Transformer and the post-LN encoder, added to the embeddings) or ``"rope"`` (no table: q and
      k are rotated in every attention layer).
    - ``mlp``: ``"gelu"``, ``"relu"`` or ``"swiglu"``. The hidden width is ``d_ff`` (default 4C) for
      all three. SwiGLU has three C × d_ff matrices instead of two: to compare at the same
      parameter budget pass ``d_ff=swiglu_hidden(4 * d_model)``, i.e. 2/3 · 4C
      (``tformer.modern_layers.swiglu_hidden``).
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

    ``gradient_checkpointing=True``: in training, each segment of ``blocks_per_segment`` blocks keeps
    only its input and recomputes its forward pass during the backward (``tformer.scaling.recompute``,
    "Fitting in memory"): the same gradients bit for bit, less memory, one more forward pass of
    the blocks.

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
        self.blocks = ModuleList(Block(C, n_heads, d_ff or 4 * C, activation=mlp, dropout=dropout,
                                       rng=self.rng, dtype=dtype, parts=parts)
                                 for _ in range(n_layers))
        self.ln_f = norm_layer(norm, C, 1e-5, dtype)
        if tie_embeddings:
            self.lm_head = TiedLinear(self.wte, bias=True)
        else:
            self.lm_head = Linear(C, vocab_size, True, self.rng, dtype, init_std=0.02)
        self.flatten_parameters()          # one flat buffer of parameters, one of gradients
        self.max_len = max_len
        self._positions = (0, 0)
        self._recompute = (Recompute(self.blocks, blocks_per_segment) if gradient_checkpointing
                           else None)
        self._recomputed = False           # did the last forward pass go through _recompute?
        self._replicas = Replicas(self)    # training with threads: the batch cut across them
        # The lean one-token step (tformer.fast.decode) is TinyGPT's default block only.
        self._lean = (norm == "layernorm" and positions != "rope" and mlp == "gelu"
                      and n_kv_heads == n_heads and attention == "plain"
                      and norm_position == "pre" and not tie_embeddings)

    def forward(self, tokens, kv_caches=None):
        """tokens: (B, T) -> logits (B, T, V). With ``kv_caches`` (one per block, inference only) the
        tokens are the new positions that follow those already in the caches.

        The entry point: it checks its input once, then runs ``_forward_whole`` (the chapter's
        equation) or, for speed or memory, one of its twins, each held equal to it by the tests:
        the lean one-token decode step (``_decode_step``, Performance), the training batch cut
        across threads (``tformer.scaling.batch_threads``, Performance) and gradient checkpointing
        (``_forward_train``, Fitting in memory).

        An empty batch (B = 0) or empty sequences (T = 0) raise ValueError: there is nothing to
        predict, and a mean loss over zero targets would be NaN. ``start + T`` positions (start =
        those already cached) must fit ``max_len``, else ValueError; ``tformer.generate`` crops a
        longer context on the left before it calls this."""
        start = self._check_input(tokens, kv_caches)
        B, T = tokens.shape
        if kv_caches and T == 1 and self._lean_step(B):
            return self._decode_step(tokens, kv_caches, start)     # (B, 1, V)
        cut = None if kv_caches or not self.training else self._replicas.split(B, T)
        if cut is not None:
            # Training with threads: each part of the batch runs whole on one thread, the first
            # on this model, the others on replicas (tformer.scaling.batch_threads).
            out = np.empty((B, T, self.config["vocab_size"]), self.lm_head.W.dtype)   # (B, T, V)
            return self._replicas.forward(
                lambda m, tok, o: m._forward_train(tok, out=o), tokens, cut, out)
        self._replicas.last = None
        if self.training and self._recompute is not None and not kv_caches:
            return self._forward_train(tokens)                  # gradient checkpointing
        self._recomputed = False
        return self._forward_whole(tokens, kv_caches, start)

    def _check_input(self, tokens, kv_caches):
        """``forward``'s checks; returns ``start``, the number of positions already cached."""
        int_array("tokens", tokens, ndim=2)
        B, T = tokens.shape
        if B == 0 or T == 0:
            raise ValueError(f"tokens: expected at least one sequence (B ≥ 1) of at least one token "
                             f"(T ≥ 1), got shape {tokens.shape}")
        if kv_caches and len(kv_caches) != len(self.blocks):
            raise ValueError(f"kv_caches: expected one per block ({len(self.blocks)}), "
                             f"got {len(kv_caches)}")
        start = kv_caches[0].t if kv_caches else 0
        if start + T > self.max_len:
            raise ValueError(f"tokens: {start + T} positions exceed max_len = {self.max_len}")
        index_range("tokens", tokens, 0, self.config["vocab_size"])   # the embedding does not check
        return start

    def _forward_whole(self, tokens, kv_caches=None, start=0):
        """TinyGPT: tokens (B, T) -> logits (B, T, V), after ``start`` cached positions.

            X = W_te[tokens] + W_pe[start:start+T]      (B, T, C)
            X ← block(X)                                n_layers times
            Z = LN_f(X) W_lm + b_lm                     (B, T, V)
        """
        T = tokens.shape[1]
        # W_pe[start:start+T] is the same (T, C) block for every sequence: it is added by
        # broadcasting instead of being gathered B times, and its gradient is a sum over the batch.
        x = self.wte(tokens)                                            # (B, T, C), a fresh gather
        if self.wpe is not None:
            x += self.wpe.W[start:start + T]                            # + W_pe[pos], (T, C)
        elif self.pe is not None:
            x += self.pe[start:start + T]                               # + PE[pos], fixed
        self._positions = (start, T)
        for i, block in enumerate(self.blocks):
            x = block(x, None, kv_caches[i] if kv_caches else None)   # (B, T, C)
        h = self.ln_f(x)                                               # (B, T, C)
        return self.lm_head(h)                                         # (B, T, V)

    def _forward_train(self, tokens, out=None):
        """``_forward_whole`` in training (no cache, start 0), with its two options: the logits
        written into ``out`` (a part of the batch cut across threads) and, with
        ``gradient_checkpointing``, the blocks run through ``tformer.scaling.recompute`` (only
        each segment's input kept). The same arithmetic (tests/test_recompute.py,
        tests/test_replicas.py)."""
        T = tokens.shape[1]
        x = self.wte(tokens)                                            # (B, T, C)
        if self.wpe is not None:
            x += self.wpe.W[:T]
        elif self.pe is not None:
            x += self.pe[:T]
        self._positions = (0, T)
        self._recomputed = self._recompute is not None
        if self._recomputed:
            x = self._recompute.forward(x, None)                       # keeps segment inputs only
        for block in () if self._recomputed else self.blocks:
            x = block(x, None, None)                                   # (B, T, C)
        h = self.ln_f(x)                                               # (B, T, C)
        return self.lm_head(h) if out is None else self.lm_head(h, out=out)   # (B, T, V)

    lean_decode = True   # False: every step through the general layers (tests compare)

    def _lean_step(self, B):
        """Can one new token per sequence go through ``fast.decode`` (TinyGPT's default block,
        in inference, in float32/float64, at a size it does not split across threads)?"""
        cfg = self.config
        return (self._lean and self.lean_decode and not self.training
                and self.wte.W.dtype in decode.DTYPES
                and decode.no_split(B, cfg["d_model"], cfg["d_ff"], cfg["n_heads"]))

    def _decode_step(self, tokens, kv_caches, start):
        """One new token per sequence after ``start`` cached ones, through
        ``fast.decode``: the general layers' arithmetic in a fifth of the Python calls.
        -> (B, 1, V)."""
        B = tokens.shape[0]
        W = self.wte.W
        x = W[tokens[:, 0]]                                   # (B, C), a fresh gather
        x += self.wpe.W[start] if self.wpe is not None else self.pe[start]
        C = x.shape[1]
        ones_C, ones_L = np.full(C, 1.0 / C, x.dtype), np.ones(self.max_len, x.dtype)
        with np.errstate(over="ignore", under="ignore"):     # GELU's e^{−2u} → inf: exact
            for blk, cache in zip(self.blocks, kv_caches):
                x = decode.block_step(x, blk, cache, ones_C, ones_L)   # (B, C)
        ln = self.ln_f
        x = decode.layernorm_rows(x, ln.gamma, ln.beta, ln.eps, ones_C)
        self._positions, self._recomputed = (start, 1), False
        head = self.lm_head
        return decode.linear_rows(x, head.W, head.b)[:, None]       # (B, 1, V)

    def backward(self, dlogits):
        """dlogits: (B, T, V) -> None (tokens have no gradient); accumulates every parameter's
        gradient, by the twin of whichever pass ``forward`` ran."""
        cut = self._replicas.last
        if cut is not None:
            start, T = self._positions
            expected = (cut[-1][1], T, self.config["vocab_size"])
            if getattr(dlogits, "shape", None) != expected:
                raise ValueError(f"dlogits: expected shape {expected} (the last forward output's), "
                                 f"got {getattr(dlogits, 'shape', type(dlogits).__name__)}")
            self._replicas.backward(TinyGPT._backward_train, dlogits)
            return None
        return self._backward_train(dlogits)

    def _backward_whole(self, dlogits):
        """The backward pass of ``_forward_whole``: dlogits (B, T, V) -> None; every parameter's
        gradient accumulated, the blocks in reverse order."""
        dx = self.ln_f.backward(self.lm_head.backward(dlogits))        # (B, T, C)
        for block in reversed(self.blocks._items):
            dx = block.backward(dx)                                    # (B, T, C)
        # dW_te += the scatter-add of dX (tied: added to the head's (HᵀdZ)ᵀ, already in dW_te)
        self.wte.backward(dx)
        if self.wpe is not None:
            start, T = self._positions
            self.wpe.grads["W"][start:start + T] += dx.sum(axis=0)     # Σ_b dX[b], (T, C)
        return None

    def _backward_train(self, dlogits):
        """The backward pass of the last forward: ``_backward_whole``, or with gradient
        checkpointing the same steps with the blocks re-run segment by segment."""
        if not self._recomputed:
            return self._backward_whole(dlogits)
        dx = self.ln_f.backward(self.lm_head.backward(dlogits))        # (B, T, C)
        dx = self._recompute.backward(dx)                              # re-runs each segment
        self.wte.backward(dx)
        if self.wpe is not None:
            start, T = self._positions
            self.wpe.grads["W"][start:start + T] += dx.sum(axis=0)
        return None

    def new_kv_caches(self, B):
        """One empty KV cache per block, for ``B`` sequences of up to ``max_len`` positions."""
        return [blk.attn.new_cache(B, self.max_len) for blk in self.blocks]


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
