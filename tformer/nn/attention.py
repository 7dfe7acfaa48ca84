"""Multi-head self-attention as a module, and the key/value cache used for generation.

Every variant the five systems use is this one class with different switches:

| system | heads | projections | biases | scale | mask |
| --- | --- | --- | --- | --- | --- |
| the single attention layer, the two-layer transformer | 1 | W_q, W_k, W_v, W_o | no | 1/√d_model | none |
| the post-LN encoder | H | W_q, W_k, W_v, W_o | yes | 1/√D | none (a padding mask may be given) |
| the complete Transformer | H | W_q, W_k, W_v, W_o | yes | 1/√D | causal and padding |
| TinyGPT | 1 or H | fused W_qkv, W_proj | yes | 1/√D | causal |

``forward`` and ``backward`` read as the multi-head equations; what later chapters add sits in
methods of its own, listed where it is taught:

- The modern block: ``n_kv_heads`` (grouped-query attention: H query heads share H_kv key/value
  heads, so W_k, W_v and the KV cache shrink by H/H_kv; ``_split_heads``) and ``rope`` (rotary
  position embedding of q and k, at positions that continue after those in the KV cache;
  ``_rotate``, ``_rotate_backward``).
- Performance: the kernel for each call (causal tiles, one-token decoding; ``_kernel``), the heads
  written straight into a (B, T, C) array (``_attend``, ``_attend_backward``) and the fused
  projection's gradient written in place (``_fused_backward``), by ``tformer.fast.attention``.
- The online softmax: ``attention="flash"``, the same attention computed without storing the
  (B, H, T, T_k) probabilities (``fast.flash_attention.flash_attention_forward``).
- The KV cache of sampling: ``KVCache``, ``new_cache`` (``KVCache.crop``: speculative decoding).
- Performance: ``rows``, one decoding step of one new position a sequence through the row
  functions of ``tformer.fast.decode`` (``takes_rows``: where it applies).
"""
import math

import numpy as np

from tformer.fast import attention as fast_attention
from tformer.fast import flash_attention as fast_flash
from tformer.fast import decode as fast_decode
from tformer.fast import rope as fast_rope
from tformer.kernels.attention import causal_mask, split_heads
from tformer.core.validate import float_array
from tformer.nn import attention_checks
from tformer.nn.layers import Linear, Module, _rng

ATTENTION_KERNELS = ("plain", "flash")


def check_attention(attention):
    """``attention`` is one of ``ATTENTION_KERNELS``: ``"plain"`` (P stored) or ``"flash"`` (the
    online softmax); returns it."""
    if not isinstance(attention, str) or attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention: expected one of {list(ATTENTION_KERNELS)}, got {attention!r}")
    return attention


class KVCache:
    """Keys and values of the positions seen so far, preallocated to ``max_len``.

    Shapes: ``k, v: (B, H, max_len, D)``; ``append`` writes new positions and returns views of the
    first ``t`` positions, so generating n tokens costs O(n) copies instead of O(n²).

    ``lean``: the block it is handed to may compute one new position a sequence by its row path
    (``PreNormBlock.rows``); ``tformer.decoding.kv_cache.new_caches`` sets it where the block has
    one, a cache made here alone leaves every step on the general path.
    """

    def __init__(self, B, H, max_len, D, dtype=np.float32, lean=False):
        self.k = np.empty((B, H, max_len, D), dtype)
        self.v = np.empty((B, H, max_len, D), dtype)
        self.t = 0
        self.lean = lean

    def append(self, k, v):
        """k, v: (B, H, T_new, D) -> all keys and values so far, (B, H, t, D) each."""
        T_new = k.shape[2]
        if self.t + T_new > self.k.shape[2]:
            raise ValueError(f"k: cache holds {self.k.shape[2]} positions, {self.t + T_new} requested")
        self.k[:, :, self.t:self.t + T_new] = k
        self.v[:, :, self.t:self.t + T_new] = v
        self.t += T_new
        return self.k[:, :, :self.t], self.v[:, :, :self.t]

    def crop(self, t):
        """Keep the first ``t`` positions and forget the rest (0 ≤ t ≤ the positions held): the
        next ``append`` writes at position ``t``. Speculative decoding rolls back rejected drafts
        with it."""
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t <= self.t:
            raise ValueError(f"t: expected an integer from 0 to the {self.t} positions held, got {t!r}")
        self.t = int(t)


class MultiHeadAttention(Module):
    """Y = Concat(head_1, …, head_H) W_o + b_o,  head_h = softmax(Q_h K_hᵀ · scale + M) V_h.

    ``x: (B, T, C)`` -> ``(B, T, C)``, ``H = n_heads``, ``D = C / H``. With ``fused_qkv`` the three
    projections are one ``W_qkv: (C, 3C)`` (TinyGPT's), otherwise ``W_q, W_k, W_v: (C, C)``.
    ``scale`` defaults to 1/√D. ``causal=True`` adds the causal mask; ``forward(x, mask)`` takes an
    extra boolean or additive mask broadcastable to ``(B, H, T, T)`` (e.g. a padding mask).
    ``n_kv_heads`` (default H): grouped-query attention, query head h reads key/value head
    ⌊h H_kv / H⌋; W_k and W_v are ``(C, H_kv·D)`` (fused: ``W_qkv: (C, C + 2 H_kv D)``).
    ``rope=True``: q and k are rotated by RoPE (``tformer.fast.rope``, ``rope_base``) before the scores.
    ``attention``: the kernel, ``"plain"`` (``fast.attention.attention_forward``; after a forward pass
    ``self.att`` holds the probabilities ``(B, H, T, T_k)``) or ``"flash"``
    (``fast.flash_attention.flash_attention_forward``: the same result, computed tile by tile without storing the
    probabilities; ``self.att`` is None).
    """

    saved = ("_cache", "att", "_rope")      # the kernel's cache, the probabilities P, RoPE's tables

    def __init__(self, d_model, n_heads=1, bias=True, fused_qkv=False, causal=False, scale=None,
                 rng=None, dtype=np.float32, init_std=None, seed=0, n_kv_heads=None, rope=False,
                 rope_base=10000.0, attention="plain"):
        super().__init__()
        self.attention = check_attention(attention)
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"n_heads: must divide d_model = {d_model}, got {n_heads}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, (int, np.integer)) \
                or n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads: expected an integer ≥ 1 that divides n_heads = {n_heads}, "
                             f"got {n_kv_heads!r}")
        if rope and (d_model // n_heads) % 2:
            raise ValueError(f"rope: needs an even head size D = d_model / n_heads, got D = {d_model // n_heads}")
        rng = _rng(rng, seed)
        self.d_model, self.n_heads, self.causal, self.fused = d_model, n_heads, causal, fused_qkv
        self.n_kv_heads, self.rope, self.rope_base = int(n_kv_heads), bool(rope), rope_base
        self.scale = scale
        C = d_model
        C_kv = self.n_kv_heads * (C // n_heads)                          # H_kv · D
        if fused_qkv:
            self.qkv = Linear(C, C + 2 * C_kv, bias, rng, dtype, init_std)
        else:
            self.q = Linear(C, C, bias, rng, dtype, init_std)
            self.k = Linear(C, C_kv, bias, rng, dtype, init_std)
            self.v = Linear(C, C_kv, bias, rng, dtype, init_std)
        self.o = Linear(C, C, bias, rng, dtype, init_std)
        self.att = None
        self._cache = None
        self._rope = None

    def forward(self, x, mask=None, kv_cache=None):
        """x: (B, T, C) -> (B, T, C). With ``kv_cache`` (generation, no backward) the keys and values
        of earlier positions come from the cache and ``x`` holds only the new positions."""
        self._check_input(x)
        q, k, v = self._project(x)                                  # Q = X W_q, K = X W_k, V = X W_v
        q, k, v = self._split_heads(q, k, v)                        # (B, H, T, D): Q_h, K_h, V_h
        q, k = self._rotate(q, k, kv_cache)                         # RoPE (the modern block); else as given
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)                            # (B, H, T_k, D): the cached keys too
        merged, att_cache = self._attend(q, k, v, mask)             # Concat(head_1, …, head_H): (B, T, C)
        self._cache = None if kv_cache is not None else att_cache
        return self.o(merged)                                       # Concat(head_1, …, head_H) W_o + b_o

    def backward(self, dy):
        """dy: (B, T, C) -> dx: (B, T, C); accumulates every projection's gradients."""
        if self._cache is None:
            raise RuntimeError("backward: no forward pass to differentiate (or it used a KV cache)")
        dmerged = self.o.backward(dy)                               # ∂L/∂Concat(heads): (B, T, C)
        dheads = split_heads(dmerged, self.n_heads)                 # (B, H, T, D), a view
        if self.fused:
            return self._fused_backward(dheads)
        dq, dk, dv = self._attend_backward(dheads)                  # ∂L/∂Q, ∂L/∂K, ∂L/∂V: (B, T, ·)
        dx = self.q.backward(dq)                                    # ∂L/∂X = ∂L/∂Q W_qᵀ
        dx += self.k.backward(dk)                                   #       + ∂L/∂K W_kᵀ
        dx += self.v.backward(dv)                                   #       + ∂L/∂V W_vᵀ
        return dx

    def _check_input(self, x):
        float_array("x", x, ndim=3)
        if x.shape[2] != self.d_model:
            raise ValueError(f"x: expected last axis d_model = {self.d_model}, got shape {x.shape}")

    def _project(self, x):
        """Q, K, V = X W_q, X W_k, X W_v; with ``fused_qkv`` one product X W_qkv, sliced (views)."""
        if self.fused:
            qkv = self.qkv(x)                                           # (B, T, C + 2 H_kv D)
            C, C_kv = self.d_model, self.n_kv_heads * (self.d_model // self.n_heads)
            return qkv[..., :C], qkv[..., C:C + C_kv], qkv[..., C + C_kv:]
        return self.q(x), self.k(x), self.v(x)

    def _rotate(self, q, k, kv_cache=None):
        """With ``rope``: q and k rotated by RoPE at positions start … start+T−1, where ``start`` is the
        number of positions already in ``kv_cache`` (the cache keeps rotated keys). Else as given."""
        if not self.rope:
            return q, k
        start = kv_cache.t if kv_cache is not None else 0
        q, rope_q = fast_rope.rope_forward(q, start, self.rope_base)
        k, rope_k = fast_rope.rope_forward(k, start, self.rope_base)
        self._rope = (rope_q, rope_k)
        return q, k

    def _rotate_backward(self, dq, dk):
        """With RoPE, turn the gradients of the rotated q and k back (in place): dq ← Rᵀ dq."""
        if self.rope:
            fast_rope.rope_backward(dq, self._rope[0], out=dq)
            fast_rope.rope_backward(dk, self._rope[1], out=dk)

    def _split_heads(self, q, k, v):
        """(B, T, ·) -> (B, H, T, D) each; with ``n_kv_heads`` (grouped-query attention, the modern
        block) K and V have H_kv heads."""
        H, H_kv = self.n_heads, self.n_kv_heads
        return split_heads(q, H), split_heads(k, H_kv), split_heads(v, H_kv)

    def _attend(self, q, k, v, mask):
        """head_h = softmax(Q_h K_hᵀ · scale + M) V_h for every head, by the fast kernels, written into
        the (B, H, T, D) view of a (B, T, C) array: returns that array (the heads concatenated) and
        the kernel's cache; keeps P in ``self.att`` (None for ``"flash"``)."""
        B, H, T, D = q.shape
        merged, out = self._heads_buffer((B, T, H * D), q.dtype)       # (B, T, C) and its heads
        return merged, self._kernel(q, k, v, mask, out)

    def _kernel(self, q, k, v, mask, out):
        """The attention kernel for this call, writing the heads into ``out``; returns its cache."""
        self.att = None
        if self.attention == "flash":
            # The online softmax: the causal mask (queries after the cached positions) and any
            # extra mask are applied tile by tile; no (B, H, T, T_k) array is made.
            attention_checks.check_flash(q, k, v, mask, self.causal, out, None, None)
            return fast_flash.flash_attention_forward(q, k, v, mask, self.scale, self.causal, out)[1]
        if self.causal and mask is None and q.shape[2] == k.shape[2]:
            # Training, scoring, and a prompt entering an empty KV cache: the kernel's causal path
            # skips the masked tiles.
            _, cache = fast_attention.attention_forward(q, k, v, None, self.scale, is_causal=True, out=out)
        elif mask is None and q.shape[2] == 1:
            # Decoding one token: it is the last position, so it may see every cached key and the
            # causal mask (1, T_k) would be all True; no mask is built or applied.
            _, cache = fast_attention.attention_forward(q, k, v, None, self.scale, out=out)
        else:
            full = self._mask(q.shape[2], k.shape[2], mask)
            attention_checks.check_attention(q, k, v, full, False, out)       # the mask, where it enters
            _, cache = fast_attention.attention_forward(q, k, v, full, self.scale, out=out)
        self.att = cache.P                                                 # (B, H, T, T_k)
        return cache

    def _attend_backward(self, dheads):
        """∂L/∂Q, ∂L/∂K, ∂L/∂V from ∂L/∂head: (B, T, C), (B, T, H_kv·D) ×2, written head by head into
        (B, H, T, D) views (the heads come out merged), and turned back through RoPE."""
        B, H, T, D = dheads.shape
        dq, dq_h = self._heads_buffer((B, T, H * D), dheads.dtype)
        dk, dk_h = self._heads_buffer((B, T, self.n_kv_heads * D), dheads.dtype, self.n_kv_heads)
        dv, dv_h = self._heads_buffer((B, T, self.n_kv_heads * D), dheads.dtype, self.n_kv_heads)
        self._kernel_backward(dheads, out=(dq_h, dk_h, dv_h))
        self._rotate_backward(dq_h, dk_h)
        return dq, dk, dv

    def _kernel_backward(self, dheads, out):
        """The backward pass of the kernel ``_kernel`` used, into ``out = (dq, dk, dv)`` (head views)."""
        if self.attention == "flash":
            return fast_flash.flash_attention_backward(dheads, self._cache, out=out)
        return fast_attention.attention_backward(dheads, self._cache, out=out)

    def _fused_backward(self, dheads):
        """``backward`` with ``fused_qkv``: the three gradients are written by the kernel straight into
        the head-merged layout of one (B, T, C + 2 H_kv D) buffer, through views (no merge, no
        concatenation), and go back through W_qkv in one product."""
        B, H, T, D = dheads.shape
        C, C_kv = H * D, self.n_kv_heads * D
        dqkv = np.empty((B, T, C + 2 * C_kv), dheads.dtype)             # (B, T, C + 2 H_kv D)
        views = (dqkv[..., :C].reshape(B, T, H, D).transpose(0, 2, 1, 3),             # (B, H, T, D)
                 dqkv[..., C:C + C_kv].reshape(B, T, -1, D).transpose(0, 2, 1, 3),    # (B, H_kv, T, D)
                 dqkv[..., C + C_kv:].reshape(B, T, -1, D).transpose(0, 2, 1, 3))
        self._kernel_backward(dheads, out=views)
        self._rotate_backward(views[0], views[1])
        return self.qkv.backward(dqkv)

    def _heads_buffer(self, shape, dtype, n_heads=None):
        """A new (B, T, C) array and its (B, H, T, D) view: a kernel writing per-head results into
        the view leaves them already merged (Concat(head_1, …, head_H)), with no copy.
        ``n_heads`` (default H) sets the number of heads of D channels in the C given."""
        B, T, C = shape
        n = self.n_heads if n_heads is None else n_heads
        merged = np.empty((B, T, C), dtype)
        return merged, merged.reshape(B, T, n, C // n).transpose(0, 2, 1, 3)

    def _mask(self, T_q, T_k, mask):
        if not self.causal:
            return mask
        causal = causal_mask(T_q, T_k)                                    # (T_q, T_k)
        if mask is None:
            return causal
        if mask.dtype == bool:
            return mask & causal
        return np.where(causal, mask, -np.inf).astype(mask.dtype)

    def new_cache(self, B, max_len, lean=False):
        """An empty ``KVCache`` sized for this layer (``n_kv_heads`` heads: GQA caches only those)."""
        D = self.d_model // self.n_heads
        dtype = (self.qkv if self.fused else self.q).W.dtype
        return KVCache(B, self.n_kv_heads, max_len, D, dtype, lean)

    def takes_rows(self):
        """True when ``rows`` computes this layer: fused W_qkv, H_kv = H, no RoPE, the plain
        kernel, both projections with a row path of their own."""
        return (self.fused and not self.rope and self.n_kv_heads == self.n_heads
                and self.attention == "plain" and hasattr(self.qkv, "rows") and hasattr(self.o, "rows"))

    def rows(self, x, kv_cache):
        """The rows ``x: (B, C)`` of one decoding step, one new position a sequence -> (B, C):
        ``forward``'s arithmetic for a query that sees every cached key (no mask), by the row
        functions of ``tformer.fast.decode``; k and v are appended to ``kv_cache``, P is kept
        as ``forward`` keeps it. Each projection computes by its own layer's ``rows`` (a float,
        int8 or LoRA layer, each with its own arithmetic). Only where ``takes_rows()``."""
        B, C = x.shape
        qkv = self.qkv.rows(x).reshape(B, 1, 3 * C)                   # (B, 1, 3C)
        H = self.n_heads
        scale = 1.0 / math.sqrt(C // H) if self.scale is None else float(self.scale)
        merged, P = fast_decode.attention_one(qkv, kv_cache, H, scale,
                                              fast_decode.ones(kv_cache.k.shape[2], qkv.dtype))
        self.keep(att=P)                                              # P; nothing for a backward
        return self.o.rows(merged.reshape(B, C))                      # Concat(heads) W_o + b_o
