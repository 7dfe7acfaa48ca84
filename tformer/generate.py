"""Decoding from token models: greedy and sampling (temperature, top-k, top-p), with a KV cache.

A token model is anything with ``forward(tokens: (B, T) ints) -> logits: (B, T, V)``. When it can
decode with a key/value cache (``tformer.kv_cache.supports``: TinyGPT), decoding runs the prompt
once to fill one cache per block and then feeds one new token per step: step ``t`` costs O(t)
attention work instead of a full O(t²) recomputation, and the logits are the same
(``tests/test_decode.py`` checks every step).

Context longer than the model's ``max_len``: only the last ``max_len`` tokens are fed (the
prompt is cropped on the left, as nanoGPT does). With learned or sinusoidal positions, sliding the
window moves every token to a new position; with RoPE, whose scores depend only on distances, the
keys of every block after the first still come from states that attended to the dropped tokens. So
cached keys go stale: once the window is full, each further step recomputes the last ``max_len``
tokens without the cache.
"""
import numpy as np

from . import kv_cache
from ._validate import index_range, int_array


def top_k_filter(logits, k):
    """z'_v = z_v if z_v ≥ (k-th largest z) else −inf, along the last axis.

    Shapes: ``logits: (..., V)`` -> ``(..., V)`` (a new array). ``k`` ≥ V keeps everything; tokens
    tied with the k-th largest value are all kept, so more than ``k`` survive only on exact ties.
    """
    V = logits.shape[-1]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k: expected an integer ≥ 1, got {k!r}")
    if k >= V:
        return logits.copy()
    kth = np.partition(logits, V - k, axis=-1)[..., V - k:V - k + 1]          # (..., 1)
    return np.where(logits >= kth, logits, -np.inf)


def top_p_filter(logits, p):
    """Nucleus filter: keep the smallest set of most probable tokens whose probability sums to ≥ p.

    With the tokens sorted by probability, π_(1) ≥ π_(2) ≥ …, token (j) is kept when the mass
    before it, Σ_{i<j} π_(i), is below ``p``; so the most probable token is always kept, and the
    others are set to −inf. Shapes: ``logits: (..., V)`` -> ``(..., V)``; ``p`` in (0, 1].
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p: expected a probability in (0, 1], got {p!r}")
    z = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=-1, keepdims=True)                                 # (..., V)
    order = np.argsort(-probs, axis=-1, kind="stable")                         # (..., V)
    sorted_p = np.take_along_axis(probs, order, axis=-1)
    before = np.cumsum(sorted_p, axis=-1) - sorted_p                           # mass ahead of each
    keep_sorted = before < p
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return np.where(keep, logits, -np.inf)


def _rng_of(seed, rng):
    if rng is not None:
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
        return rng
    return np.random.default_rng(seed)


def _check_temperature(temperature):
    """τ is a finite number ≥ 0 (NaN or ∞ would turn every probability into NaN or a tie)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.integer, np.floating)):
        raise TypeError(f"temperature: expected a number ≥ 0, got {type(temperature).__name__}")
    if not (np.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature: expected a finite number ≥ 0, got {temperature}")


def sample_from_logits(logits, rng, temperature=1.0, top_k=None, top_p=None):
    """One token per row from ``softmax(filter(z / temperature))``; ``temperature=0`` is argmax.

    Shapes: ``logits: (B, V)`` -> ``(B,)`` int64. The draw is by inverse CDF with one uniform number
    per row, ``u ~ U[0, total)``: token v is taken when cdf_{v−1} ≤ u < cdf_v, which is impossible
    for a filtered token (its probability, hence its step of the CDF, is exactly 0).
    """
    _check_temperature(temperature)
    z = logits.astype(np.float64)
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if temperature == 0:
        return z.argmax(axis=-1)
    z = z / temperature
    if top_p is not None:
        z = top_p_filter(z, top_p)
    z -= z.max(axis=-1, keepdims=True)
    probs = np.exp(z)                                                          # (B, V), 0 where filtered
    cdf = np.cumsum(probs, axis=-1)                                            # (B, V)
    u = rng.random(z.shape[0]) * cdf[:, -1]                                    # (B,)
    idx = (cdf <= u[:, None]).sum(axis=-1)                                     # (B,)
    last = probs.shape[-1] - 1 - (probs[:, ::-1] > 0).argmax(axis=-1)          # last kept token
    return np.minimum(idx, last).astype(np.int64)                              # guards u rounding up


def _check_decode(model, prompt, max_new_tokens):
    """``_decode``'s arguments, checked before any work."""
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
    _check_decode(model, prompt, max_new_tokens)
    max_len = getattr(model, "max_len", None)
    step = kv_cache.Decoder(model) if use_cache and kv_cache.supports(model) else None
    was_training = model.training
    model.eval()
    try:
        out = prompt.astype(np.int64)                                         # (B, T0)
        done = np.zeros(out.shape[0], bool)
        caches = None
        for _ in range(max_new_tokens):
            logits, caches = _next_logits(model, out, caches, step, max_len)     # (B, ·, V)
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


def _next_logits(model, out, caches, step, max_len):
    """The logits after the tokens ``out`` (B, T), and the caches for the next step.

    With a filled cache only the last token is fed through ``step`` (a ``kv_cache.Decoder``;
    (B, 1, V)); otherwise the last ``max_len`` tokens are fed whole (B, ≤ max_len, V), filling
    new caches while there is room left, else through the model's own forward pass."""
    T = out.shape[1]
    if step is not None and caches is not None and T <= max_len:
        return step(out[:, -1:], caches), caches                              # (B, 1, V)
    ctx = out if max_len is None else out[:, -max_len:]                       # (B, ≤ max_len)
    if step is not None and T < max_len:                                      # room left: (re)fill
        caches = kv_cache.new_caches(model, out.shape[0])
        return step(ctx, caches), caches                                      # (B, T, V)
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
           stop_token=None, use_cache=True):
    """x_{t+1} ~ softmax(filter(logits(x_{≤t}) / temperature)), appended ``max_new_tokens`` times.

    ``temperature``: > 1 flattens, < 1 sharpens, 0 is greedy: the argmax at every step, so the
    same tokens as ``greedy`` (``top_k`` and ``top_p`` then change nothing, since the argmax is
    always kept, and no random number is drawn); NaN, ∞ or < 0 raise ValueError. ``top_k``: only the k most likely
    tokens; ``top_p``: only the nucleus of mass ``p`` (applied after the temperature, as in
    Hugging Face's ``generate``). The draws come from ``rng`` or, if none, from
    ``np.random.default_rng(seed)``: a fixed seed gives the same text.
    Shapes: ``prompt: (B, T0)`` ints -> ``(B, T0 + max_new_tokens)``.
    """
    gen = _rng_of(seed, rng)
    _check_temperature(temperature)

    def pick(z):
        return sample_from_logits(z, gen, temperature, top_k, top_p)
    return _decode(model, prompt, max_new_tokens, pick, stop_token, use_cache)
