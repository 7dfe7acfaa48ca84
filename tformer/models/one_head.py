"""The first chapter's model: a byte-level language model with one causal attention head.

    X = W_te[tokens] + W_pe[0:T]                         (B, T, C)   token + position embeddings
    Q = X W_q,  K = X W_k,  V = X W_v                    (B, T, C)   each
    A = softmax(Q Kᵀ / √C + M),  M_ij = −∞ for j > i     (B, T, T)   who each position listens to
    H = X + A V                                          (B, T, C)   the residual
    Z = H W_lm + b_lm                                    (B, T, 256) next-byte logits

Everything a GPT has except depth, heads, norms and the MLP: the smallest model that already
predicts the next byte from the bytes before it. Each piece is a layer of the book's package.
"""
import numpy as np

from tformer.nn import functional as F
from tformer.core.validate import index_range, token_batch, upstream
from tformer.nn.layers import Embedding, Linear, Module


class OneHeadLM(Module):
    """logits = OneHeadLM(tokens): ``tokens: (B, T)`` ints in [0, V) -> ``logits: (B, T, V)``.

    Parameters: ``wte.W: (V, C)`` and ``wpe.W: (max_len, C)`` (the two embedding tables),
    ``q.W, k.W, v.W: (C, C)`` (the head's projections, no bias; head size D = C), ``lm_head.W:
    (C, V)`` and ``lm_head.b: (V,)``; every matrix drawn from N(0, 0.02²), so the first logits
    are near zero and the first loss near ln V. After a forward pass ``att`` holds the attention
    probabilities A, ``(B, T, T)``.

    Input checks: ``tokens`` must be a 2-axis integer array with B, T ≥ 1, T ≤ ``max_len`` and
    ids in [0, V); else ValueError or TypeError naming ``tokens``. ``backward`` needs a forward
    pass first (RuntimeError) and ``dlogits`` of the logits' shape and dtype.
    """

    def __init__(self, d_model=32, max_len=64, vocab_size=256, seed=0, dtype=np.float32):
        super().__init__()
        self.config = dict(d_model=d_model, max_len=max_len, vocab_size=vocab_size,
                           dtype=np.dtype(dtype).name)
        rng, C = np.random.default_rng(seed), d_model
        self.wte = Embedding(vocab_size, C, rng, dtype, init_std=0.02)
        self.wpe = Embedding(max_len, C, rng, dtype, init_std=0.02)
        self.q = Linear(C, C, False, rng, dtype, init_std=0.02)
        self.k = Linear(C, C, False, rng, dtype, init_std=0.02)
        self.v = Linear(C, C, False, rng, dtype, init_std=0.02)
        self.lm_head = Linear(C, vocab_size, True, rng, dtype, init_std=0.02)
        self.max_len = max_len
        self._attn, self._out = None, None   # attention's cache; (shape, dtype) of the logits

    @property
    def att(self):
        """A = softmax(Q Kᵀ / √C + M) of the last forward pass, ``(B, T, T)`` (None before one)."""
        return None if self._attn is None else self._attn.P

    def forward(self, tokens):
        """tokens: (B, T) ints -> logits: (B, T, V)."""
        token_batch("tokens", tokens, self.max_len)                    # (B, T), T ≤ max_len
        index_range("tokens", tokens, 0, self.config["vocab_size"])   # ids in [0, V)
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(np.arange(T)[None])             # (B, T, C)
        q, k, v = self.q(x), self.k(x), self.v(x)                       # (B, T, C) each
        y, self._attn = F.attention_forward(q, k, v, mask=F.causal_mask(T))   # A V, (B, T, C)
        logits = self.lm_head(x + y)                                    # (B, T, V)
        self._out = (logits.shape, logits.dtype)
        return logits

    def backward(self, dlogits):
        """dlogits: (B, T, V) -> None (tokens have no gradient); accumulates every gradient."""
        upstream("dlogits", dlogits, self._out)
        dh = self.lm_head.backward(dlogits)                             # ∂L/∂H, (B, T, C)
        dq, dk, dv = F.attention_backward(dh, self._attn)               # through A V
        # X reaches H four times: the residual, and through Q, K and V: four terms add up.
        dx = dh + self.q.backward(dq) + self.k.backward(dk) + self.v.backward(dv)
        self.wte.backward(dx)                                           # rows of W_te looked up
        self.wpe.backward(dx.sum(axis=0, keepdims=True))                # Σ_b dX[b], (1, T, C)
        return None
