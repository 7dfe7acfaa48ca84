"""Decoding with a key/value cache: the caches a model's own forward is handed.

    logits = model.forward(tokens, kv_cache=caches)     tokens: (B, T_new) -> (B, T_new, V)

is the model's forward pass on the positions after those the caches hold, computed by the
model's own layers, with one difference: each attention layer reads the keys and values of the
earlier positions from its cache (``MultiHeadAttention.forward`` with ``kv_cache``) and appends
the new ones. So every layer decodes with its own arithmetic: a quantized layer with its int8
products, a LoRA layer with its adapter, the modern block's layers as they train. nanochat's
``GPT.forward(idx, kv_cache)`` has the same shape; ``tformer.decoding.generate``,
``speculative`` and the benchmarks call it.

One new token a sequence, in eval mode, goes through the layers' row paths where a block has them
(TinyGPT's default block: ``PreNormBlock.rows``, each layer by its own ``rows``; then LN_f and
the head), a choice made inside the block's ``forward`` and the model's, with the row functions
of ``tformer.fast.decode``: the same NumPy calls on the same arrays in a fraction of the Python
calls (the chapter "Performance" counts both), tests/decoding/test_decode.py holding it bit for
bit equal to the general path. ``new_caches(model, B, lean=False)`` keeps every step on the
general path.

A model decodes with a cache when it has ``forward(tokens, kv_cache)``, ``blocks`` whose
attention layers make caches (``new_cache``) and ``max_len`` (TinyGPT, with every option of the
modern block, quantized or with LoRA adapters).
"""
import inspect

from tformer.nn.attention import KVCache  # noqa: F401  (the cache of one attention layer)


def supports(model):
    """True when ``model`` can decode with a KV cache (see the module docstring)."""
    blocks = getattr(model, "blocks", None)
    forward = getattr(model, "forward", None)
    return (hasattr(model, "max_len") and blocks is not None and len(blocks) > 0
            and callable(forward) and "kv_cache" in inspect.signature(forward).parameters
            and all(hasattr(getattr(b, "attn", None), "new_cache") for b in blocks))


def new_caches(model, B, lean=True):
    """One empty ``KVCache`` per block, for ``B`` sequences of up to ``model.max_len`` positions.

    ``lean``: a block may compute one new position a sequence by its row path (where it has one,
    ``takes_rows()``); False keeps every step on the general path (the tests compare the two).
    The blocks' layers are read here, once: make new caches after replacing a layer."""
    return [blk.attn.new_cache(B, model.max_len, lean and _takes_rows(blk)) for blk in model.blocks]


def _takes_rows(block):
    takes_rows = getattr(block, "takes_rows", None)
    return bool(takes_rows and takes_rows())
