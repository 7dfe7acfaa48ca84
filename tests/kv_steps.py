"""Decoding a sequence step by step through the model's own forward with KV caches
(``tformer.decoding.kv_cache``), for the tests that compare it with the forward pass without them."""
from tformer.decoding import kv_cache


def cached_logits(model, seq, prefill, lean=True):
    """The logits of ``seq: (B, T)`` fed as a ``prefill``-token prompt and then one token at a
    time through ``model.forward(tokens, kv_cache=caches)``: ``[(B, prefill, V), (B, 1, V), …]``,
    and the filled caches. ``lean=False``: every step on the general path."""
    caches = kv_cache.new_caches(model, seq.shape[0], lean=lean)
    out = [model.forward(seq[:, :prefill], kv_cache=caches)]
    out += [model.forward(seq[:, t:t + 1], kv_cache=caches) for t in range(prefill, seq.shape[1])]
    return out, caches
