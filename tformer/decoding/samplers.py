"""Samplers: each one a transformation of the next-token distribution, written on its logits.

    temperature   z'_v = z_v / τ                                       τ > 0 (τ = 0: the argmax)
    top-k         z'_v = z_v if z_v ≥ z_(k) else −∞                    z_(k): the k-th largest
    top-p         z'_v = z_v if Σ_{u before v} π_u < p else −∞         the nucleus of mass p
    min-p         z'_v = z_v if π_v ≥ min_p · max_u π_u else −∞        (Nguyen et al. 2024)

with π = softmax(z) the distribution each filter receives. A token set to −∞ has probability
exactly 0 after the softmax; the others keep their ratios, so each filter renormalises the mass it
keeps. Shapes: logits ``(..., V)`` -> ``(..., V)``.

**One order.** ``filter_logits`` composes them as Hugging Face transformers' ``generate`` does
(``GenerationMixin._get_logits_processor``, transformers 5.24.0: ``TemperatureLogitsWarper``, then
``TopKLogitsWarper``, ``TopPLogitsWarper``, ``MinPLogitsWarper``): the temperature first, then
top-k, top-p and min-p, each on what the one before left. So top-p's nucleus and min-p's threshold
are those of the tempered distribution, already cut by top-k (top-k itself commutes with the
temperature: dividing by τ > 0 keeps the order of the logits).

**Limits.** ``top_k=1`` and ``τ → 0`` are greedy (only the argmax); ``top_p=1``, ``min_p=0`` and
``top_k ≥ V`` keep every token; ``τ = 1`` changes nothing. ``tests/decoding/test_samplers.py`` checks these,
the mass each keeps, and every filter and their composition against Hugging Face's processors.

Bad values raise ValueError naming the argument (``top_k`` an integer ≥ 1, ``top_p`` in (0, 1],
``min_p`` in [0, 1], the temperature a finite number ≥ 0); checked once, by ``check_sampling``,
where a sampling call enters.
"""
import numbers

import numpy as np

from tformer.fast.softmax import softmax, softmax_weights


def _is_number(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_temperature(temperature):
    """τ is a finite number ≥ 0 (NaN or ∞ would turn every probability into NaN or a tie)."""
    if not _is_number(temperature):
        raise TypeError(f"temperature: expected a number ≥ 0, got {type(temperature).__name__}")
    if not (np.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature: expected a finite number ≥ 0, got {temperature}")


def check_sampling(temperature=1.0, top_k=None, top_p=None, min_p=None):
    """The sampler settings, checked once where they enter (None: that filter is off)."""
    check_temperature(temperature)
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)
                              or top_k < 1):
        raise ValueError(f"top_k: expected an integer ≥ 1, got {top_k!r}")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p: expected a probability mass in (0, 1], got {top_p!r}")
    if min_p is not None and not (_is_number(min_p) and 0 <= min_p <= 1):
        raise ValueError(f"min_p: expected a fraction of the largest probability in [0, 1], "
                         f"got {min_p!r}")


def top_k_filter(logits, k):
    """z'_v = z_v if z_v ≥ (k-th largest z) else −inf, along the last axis.

    Shapes: ``logits: (..., V)`` -> ``(..., V)`` (a new array). ``k`` ≥ V keeps everything; tokens
    tied with the k-th largest value are all kept, so more than ``k`` survive only on exact ties
    (as Hugging Face's ``TopKLogitsWarper``).
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
    before it, Σ_{i<j} π_(i), is below ``p``, that is when the mass from it down,
    t_j = Σ_{i≥j} π_(i), is above 1 − p of the total. t_j is summed from the least probable token
    up: near p = 1 the tokens at the boundary can be as small as the rounding of a running sum
    from the top (about 1e-16 per addition near 1), which would decide the boundary instead of
    them. The most probable token is always kept, the others are set to −inf. Tokens of equal
    probability are sorted by index (the lower first), so a tie across the boundary keeps the
    lower indices. Shapes: ``logits: (..., V)`` -> ``(..., V)``; ``p`` in (0, 1], and ``p = 1``
    keeps every token.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p: expected a probability in (0, 1], got {p!r}")
    if p == 1.0:                                     # the whole mass: nothing is cut
        return logits.copy()
    probs = softmax(logits)                                                    # (..., V)
    order = np.argsort(-probs, axis=-1, kind="stable")                         # (..., V)
    sorted_p = np.take_along_axis(probs, order, axis=-1)
    tail = np.cumsum(sorted_p[..., ::-1], axis=-1)[..., ::-1]                  # t_j, smallest first
    keep_sorted = tail > (1 - p) * tail[..., :1]                               # Σ_{i<j} π_(i) < p
    keep_sorted[..., 0] = True                       # also where 1 − p rounds to 1
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return np.where(keep, logits, -np.inf)


def min_p_filter(logits, min_p):
    """z'_v = z_v if π_v ≥ min_p · max_u π_u else −inf (min-p, Nguyen et al. 2024).

    The ratio π_v / max_u π_u is exp(z_v − max_u z_u), so the threshold needs no softmax. The most
    probable token is always kept (min_p ≤ 1); ``min_p = 0`` keeps every token, ``min_p = 1`` only
    those tied with the largest. Shapes: ``logits: (..., V)`` -> ``(..., V)``.
    """
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p: expected a fraction in [0, 1], got {min_p!r}")
    ratio = softmax_weights(logits)                                            # π_v / max π
    return np.where(ratio >= min_p, logits, -np.inf)


def filter_logits(logits, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """z' = min_p(top_p(top_k(z / τ))): the samplers in Hugging Face's order (module docstring).

    Shapes: ``logits: (..., V)`` -> ``(..., V)`` float64; None turns a filter off. ``τ > 0`` here
    (τ = 0 is the argmax: ``probabilities``, ``sample_from_logits``).
    """
    z = logits.astype(np.float64) / temperature
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = top_p_filter(z, top_p)
    if min_p is not None:
        z = min_p_filter(z, min_p)
    return z


def probabilities(logits, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """π = softmax(filter_logits(z)), the distribution a sampler draws from; ``τ = 0``: one-hot
    at the argmax (the first on a tie), the limit τ → 0.

    Shapes: ``logits: (B, V)`` -> ``(B, V)`` float64, each row summing to 1.
    """
    check_sampling(temperature, top_k, top_p, min_p)
    if temperature == 0:
        z = np.asarray(logits, dtype=np.float64)
        one_hot = np.zeros(z.shape)                                            # (B, V)
        np.put_along_axis(one_hot, z.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return one_hot
    return softmax(filter_logits(logits, temperature, top_k, top_p, min_p))


def draw(weights, rng):
    """One token per row, v with probability w_v / Σ_u w_u, by inverse CDF with one uniform number
    per row, ``u ~ U[0, total)``: token v is taken when cdf_{v−1} ≤ u < cdf_v, which is impossible
    for a token of weight 0 (its step of the CDF is exactly 0).

    Shapes: ``weights: (B, V)`` ≥ 0, not all 0 in a row -> ``(B,)`` int64.
    """
    cdf = np.cumsum(weights, axis=-1)                                          # (B, V)
    u = rng.random(weights.shape[0]) * cdf[:, -1]                              # (B,)
    idx = (cdf <= u[:, None]).sum(axis=-1)                                     # (B,)
    last = weights.shape[-1] - 1 - (weights[:, ::-1] > 0).argmax(axis=-1)     # last kept token
    return np.minimum(idx, last).astype(np.int64)                  # guards u rounding up


def sample_from_logits(logits, rng, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """One token per row from ``softmax(filter_logits(z))``; ``temperature=0`` is argmax.

    Shapes: ``logits: (B, V)`` -> ``(B,)`` int64. The filters run in one order: temperature,
    top-k, top-p, min-p (the module docstring); the draw is ``draw``'s inverse CDF on the
    unnormalised weights exp(z' − max z').
    """
    check_sampling(temperature, top_k, top_p, min_p)
    if temperature == 0:                       # every filter keeps the argmax: it is the answer
        return logits.astype(np.float64).argmax(axis=-1)
    z = filter_logits(logits, temperature, top_k, top_p, min_p)                # (B, V)
    return draw(softmax_weights(z), rng)                                       # 0 where filtered
