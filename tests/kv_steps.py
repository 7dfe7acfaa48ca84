"""Decoding a sequence step by step through ``tformer.decoding.kv_cache``, for the tests that compare it
with the model's own forward pass."""
from tformer.decoding import kv_cache


def cached_logits(model, seq, prefill, lean=True):
    """The logits of ``seq: (B, T)`` fed as a ``prefill``-token prompt and then one token at a
    time: ``[(B, prefill, V), (B, 1, V), …]``, and the filled caches."""
    step, caches = kv_cache.Decoder(model, lean=lean), kv_cache.new_caches(model, seq.shape[0])
    out = [step(seq[:, :prefill], caches)]
    out += [step(seq[:, t:t + 1], caches) for t in range(prefill, seq.shape[1])]
    return out, caches
