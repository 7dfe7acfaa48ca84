"""Using a model: decoding with a key/value cache, samplers, greedy and sampled generation, beam search, speculative decoding, int8 weights.

- ``kv_cache``: the model's own forward, one new token at a time, with a cache;
- ``samplers`` (temperature, top-k, top-p, min-p), ``generate``, ``beam``, ``speculative``;
- ``quantize``: int8 weights (and activations) for inference.
"""
