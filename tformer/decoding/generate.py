"""Decoding from token models: greedy and sampling (``tformer.decoding.samplers``), with a KV cache.

A token model is anything with ``forward(tokens: (B, T) ints) -> logits: (B, T, V)``. When it can
decode with a key/value cache (``tformer.decoding.kv_cache.supports``: TinyGPT), decoding runs the prompt
once to fill one cache per block and then feeds one new token per step: step ``t`` costs O(t)
attention work instead of a full O(t²) recomputation, and the logits are the same
(``tests/decoding/test_decode.py`` checks every step).

Context longer than the model's ``max_len``: only the last ``max_len`` tokens are fed (the
prompt is cropped on the left, as nanoGPT does). With learned or sinusoidal positions, sliding the
window moves every token to a new position; with RoPE, whose scores depend only on distances, the
keys of every block after the first still come from states that attended to the dropped tokens. So
cached keys go stale: once the window is full, each further step recomputes the last ``max_len``
tokens without the cache.
"""
import numpy as np

from tformer.decoding import kv_cache
from tformer.core.validate import index_range, int_array
# The samplers live in tformer.decoding.samplers; their names stay importable from here.
from tformer.decoding.samplers import (check_sampling, probabilities, sample_from_logits,  # noqa: F401
                       top_k_filter, top_p_filter, min_p_filter)


def rng_of(seed, rng):
    """The generator a decoding run draws from: ``rng`` if given (checked), else a new one from
    ``seed``. Every sampling decoder (``sample``, ``speculative``) takes its randomness here."""
    if rng is not None:
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
        return rng
    return np.random.default_rng(seed)


def check_decode(model, prompt, max_new_tokens):
    """A decoding run's arguments (the model, ``prompt: (B, T)`` token ids, ``max_new_tokens``),
    checked before any work, for every decoder."""
    int_array("prompt", prompt, ndim=2)
    if prompt.shape[0] < 1:
        raise ValueError(f"prompt: expected at least one row (B ≥ 1), got shape {prompt.shape}")
    if prompt.shape[1] < 1:
        raise ValueError(f"prompt: expected at least one token per row, got shape {prompt.shape}")
    vocab_size = getattr(model, "config", {}).get("vocab_size")
    if vocab_size is not None:                    # named here, not as the model's ``tokens``
        index_range("prompt", prompt, 0, vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
            or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an integer ≥ 0, got {max_new_tokens!r}")


def _decode(model, prompt, max_new_tokens, pick, stop_token=None, use_cache=True):
    """Append ``max_new_tokens`` tokens chosen by ``pick(last_logits: (B, V)) -> (B,)``."""
    check_decode(model, prompt, max_new_tokens)
    max_len = getattr(model, "max_len", None)
    cached = use_cache and kv_cache.supports(model)
    was_training = model.training
    model.eval()
    try:
        out = prompt.astype(np.int64)                                         # (B, T0)
        done = np.zeros(out.shape[0], bool)
        caches = None
        for _ in range(max_new_tokens):
            logits, caches = _next_logits(model, out, caches, cached, max_len)   # (B, ·, V)
            nxt = np.asarray(pick(logits[:, -1]), dtype=np.int64)              # (B,)
            if stop_token is not None:
                nxt = np.where(done, stop_token, nxt)
                done |= nxt == stop_token
            out = np.concatenate([out, nxt[:, None]], axis=1)                 # (B, T + 1)
            if stop_token is not None and done.all():
                break
        return out.astype(prompt.dtype, copy=False)
    finally:
        model.train(was_training)


def _next_logits(model, out, caches, cached, max_len):
    """The logits after the tokens ``out`` (B, T), and the caches for the next step.

    The model's own forward pass, every time: with a filled cache (``cached``: the model decodes
    with one) only the last token is fed (B, 1, V); otherwise the last ``max_len`` tokens are fed
    whole (B, ≤ max_len, V), filling new caches while there is room left, else without one."""
    T = out.shape[1]
    if caches is not None and T <= max_len:
        return model.forward(out[:, -1:], kv_cache=caches), caches           # (B, 1, V)
    ctx = out if max_len is None else out[:, -max_len:]                       # (B, ≤ max_len)
    if cached and T < max_len:                                                # room left: (re)fill
        caches = kv_cache.new_caches(model, out.shape[0])
        return model.forward(ctx, kv_cache=caches), caches                   # (B, T, V)
    return model.forward(ctx), None                                           # (B, T, V)


def greedy(model, prompt, max_new_tokens, stop_token=None, use_cache=True):
    """x_{t+1} = argmax_v logits(x_{≤t})_v, appended ``max_new_tokens`` times.

    Shapes: ``prompt: (B, T0)`` ints -> ``(B, T0 + max_new_tokens)`` (fewer if every row emitted
    ``stop_token``). Uses the model's KV cache when it has one (``use_cache=False``: full
    recomputation at every step). Runs the model in eval mode and restores its mode afterwards.
    A prompt longer than the model's ``max_len`` is allowed: only its last ``max_len`` tokens are
    fed (see the module docstring). An empty prompt (B = 0 or T0 = 0) raises ValueError.
    """
    return _decode(model, prompt, max_new_tokens, lambda z: z.argmax(axis=-1), stop_token, use_cache)


def sample(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=0, rng=None,
           stop_token=None, use_cache=True, min_p=None):
    """x_{t+1} ~ softmax(filter(logits(x_{≤t}) / temperature)), appended ``max_new_tokens`` times.

    ``temperature``: > 1 flattens, < 1 sharpens, 0 is greedy: the argmax at every step, so the
    same tokens as ``greedy`` (the filters then change nothing, since the argmax is always kept,
    and no random number is drawn); NaN, ∞ or < 0 raise ValueError. ``top_k``: only the k most
    likely tokens; ``top_p``: only the nucleus of mass ``p``; ``min_p``: only the tokens of
    probability ≥ min_p times the largest. They apply in Hugging Face's order, temperature, top-k,
    top-p, min-p (``tformer.decoding.samplers``). The draws come from ``rng`` or, if none, from
    ``np.random.default_rng(seed)``: a fixed seed gives the same text.
    Shapes: ``prompt: (B, T0)`` ints -> ``(B, T0 + max_new_tokens)``.
    """
    gen = rng_of(seed, rng)
    check_sampling(temperature, top_k, top_p, min_p)

    def pick(z):
        return sample_from_logits(z, gen, temperature, top_k, top_p, min_p)
    return _decode(model, prompt, max_new_tokens, pick, stop_token, use_cache)
