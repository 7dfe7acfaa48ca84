"""Decoding with a key/value cache: a model's logits for new positions after those it has cached.

    X = embed(tokens, start)          (B, T_new, C)   at positions start … start + T_new − 1
    X ← block(X; cache_i)             each attention layer appends its new keys and values
    Z = LN_f(X) W_lm + b_lm           (B, T_new, V)

It is the model's forward pass, computed by the model's own layers, with one difference: attention
reads the keys and values of the earlier positions from its cache (``MultiHeadAttention.forward``
with ``kv_cache``) instead of recomputing them. So every layer decodes with its own arithmetic: a
quantized layer with its int8 products, a LoRA layer with its adapter, the modern block's layers
as they train. The model knows nothing of it (nanoGPT keeps ``generate`` out of ``model.py`` the
same way); ``tformer.decoding.generate`` calls it.

One new token per sequence through TinyGPT's default block has a lean path,
``tformer.fast.decode``: the same NumPy calls on the same arrays in a fraction of the Python
calls (the chapter "Performance" counts both), every linear map through its own layer's
``rows`` (tests/test_decode.py holds it bit for bit equal to the general path). It is taken where
the model's blocks are that block and no kernel would split its work across threads.

A model decodes with a cache when it has ``embed(tokens, start)``, ``blocks`` whose attention
layers make caches (``new_cache``), ``ln_f``, ``lm_head`` and ``max_len`` (TinyGPT, with every
option of the modern block, quantized or with LoRA adapters).
"""
import numpy as np

from tformer.nn.attention import MultiHeadAttention
from tformer.nn.blocks import PreNormBlock
from tformer.fast import decode
from tformer.nn.layers import FeedForward, LayerNorm
from tformer.models.tinygpt import check_tokens


def supports(model):
    """True when ``model`` can decode with a KV cache (see the module docstring)."""
    blocks = getattr(model, "blocks", None)
    return (all(hasattr(model, a) for a in ("embed", "ln_f", "lm_head", "max_len"))
            and blocks is not None and len(blocks) > 0
            and all(hasattr(getattr(b, "attn", None), "new_cache") for b in blocks))


def new_caches(model, B):
    """One empty ``KVCache`` per block, for ``B`` sequences of up to ``model.max_len`` positions."""
    return [blk.attn.new_cache(B, model.max_len) for blk in model.blocks]


class Decoder:
    """``Decoder(model)(tokens, caches) -> logits``: the logits of ``tokens: (B, T_new)``, the
    positions that follow those in ``caches``, which it extends; ``(B, T_new, V)``.

    ``lean=False`` keeps every step on the general path (the tests compare the two). The model's
    structure is read once, here: build a new decoder after replacing its layers."""

    def __init__(self, model, lean=True):
        self.model = model
        self.lean = lean and _lean_blocks(model)

    def __call__(self, tokens, caches):
        model = self.model
        start = check(model, tokens, caches)
        B, T = tokens.shape
        cfg = getattr(model, "config", {})
        if (T == 1 and self.lean and not model.training
                and decode.no_split(B, cfg["d_model"], cfg["d_ff"], cfg["n_heads"])):
            return lean_step(model, tokens, caches, start)          # (B, 1, V)
        x = model.embed(tokens, start)                              # (B, T, C)
        for blk, cache in zip(model.blocks, caches):
            x = blk(x, None, cache)                                 # (B, T, C), cache extended
        return model.lm_head(model.ln_f(x))                         # (B, T, V)


def check(model, tokens, caches):
    """The step's arguments, checked once: one cache per block, and ``tokens`` as the model's
    forward pass takes them, after the ``start`` positions already cached; returns ``start``."""
    if len(caches) != len(model.blocks):
        raise ValueError(f"kv_caches: expected one per block ({len(model.blocks)}), "
                         f"got {len(caches)}")
    start = caches[0].t
    check_tokens(tokens, model.max_len, model.config["vocab_size"], start)
    return start


def _lean_blocks(model):
    """Is every block TinyGPT's default one (pre-norm, LayerNorm, fused W_qkv with H_kv = H, no
    RoPE, the plain kernel, a GELU MLP), every linear map one with ``rows``, and the model in
    float32 or float64?"""
    def linear_ok(layer):
        return hasattr(layer, "rows")

    def block_ok(b):
        a, f = b.attn, b.ffn
        return (type(b) is PreNormBlock and type(b.ln1) is LayerNorm and type(b.ln2) is LayerNorm
                and isinstance(a, MultiHeadAttention) and a.fused and not a.rope
                and a.n_kv_heads == a.n_heads and a.attention == "plain"
                and type(f) is FeedForward and f.act.name == "gelu"
                and all(map(linear_ok, (a.qkv, a.o, f.fc1, f.fc2))))
    return (type(model.ln_f) is LayerNorm and model.ln_f.gamma.dtype in decode.DTYPES
            and linear_ok(model.lm_head) and all(map(block_ok, model.blocks)))


def lean_step(model, tokens, caches, start):
    """One new token per sequence after ``start`` cached ones, through ``fast.decode``: the
    general path's arithmetic in a fraction of the Python calls. -> (B, 1, V)."""
    x = model.embed(tokens, start)[:, 0]                    # (B, C), a fresh gather
    C = x.shape[1]
    ones_C, ones_L = np.full(C, 1.0 / C, x.dtype), np.ones(model.max_len, x.dtype)
    with np.errstate(over="ignore", under="ignore"):       # GELU's e^{−2u} → inf: exact
        for blk, cache in zip(model.blocks, caches):
            x = decode.block_step(x, blk, cache, ones_C, ones_L)   # (B, C)
    ln = model.ln_f
    x = decode.layernorm_rows(x, ln.gamma, ln.beta, ln.eps, ones_C)
    return model.lm_head.rows(x)[:, None]                   # (B, 1, V)
