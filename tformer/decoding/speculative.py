"""Speculative decoding: a draft model proposes, the target checks, and the text is the target's.

Leviathan et al. 2023 (Fast inference from transformers via speculative decoding) and Chen et al.
2023 (Accelerating large language model decoding with speculative sampling). One round, after the
tokens x_{≤t} (q: the draft's distribution, p: the target's):

    d_i ~ q_i = q(· | x_{≤t}, d_{<i}),   i = 1 … k         k one-token steps of the draft
    p_i = p(· | x_{≤t}, d_{<i}),         i = 1 … k + 1     ONE forward of the target
    d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)), in order, until one is not;
    rejected at i:  y ~ norm(max(0, p_i − q_i))            the residual, and the round ends
    all accepted:   y ~ p_{k+1}                            the bonus token

A round writes the accepted drafts and y: from 1 to k + 1 tokens for one forward of the target.
Why they are distributed as p: a token x leaves step i either accepted, with probability
q(x) min(1, p(x)/q(x)) = min(p(x), q(x)), or drawn from the residual after a rejection, whose
probability is 1 − Σ_y min(p(y), q(y)) = Σ_y max(0, p(y) − q(y)); that times the residual's
max(0, p(x) − q(x)) / Σ_y max(0, p(y) − q(y)) is max(0, p(x) − q(x)), and
min(p, q) + max(0, p − q) = p. (tests/decoding/test_speculative.py proves it with SymPy, and enumerates
every branch of the rounds on tiny models.)

**Samplers.** p and q are the *filtered* distributions (``tformer.decoding.samplers.probabilities``: the
temperature, top-k, top-p and min-p apply to both before the rule), so the text is distributed as
``tformer.decoding.generate.sample`` writes it with the same settings. Temperature 0 makes p and q one-hot:
a draft is accepted exactly when it is the target's argmax, and the residual is then the target's
argmax, so the text is ``tformer.decoding.generate.greedy``'s, token for token.

**Caches.** Both models decode through their KV caches (``tformer.decoding.kv_cache``), each layer with its
own arithmetic (quantized, LoRA, the modern block). Each cache holds every token written but the
last, which the next round feeds first. After a round both are cropped (``KVCache.crop``) to the
tokens kept, so a rejected draft leaves nothing behind.

**Context.** A round proposes fewer than k drafts where ``max_new_tokens`` or a model's ``max_len``
leaves less room (k = 0: the target alone writes one token). Once the text is longer than the
target's ``max_len``, the rest is plain sampling from the target (``tformer.decoding.generate.sample``, its
window sliding over the last ``max_len`` tokens), counted in ``Stats.plain``. Batch 1 only.
"""
from dataclasses import dataclass, field

import numpy as np

from tformer.decoding import generate, kv_cache
from tformer.decoding.samplers import check_sampling, draw, probabilities


def accept_probability(p, q, x):
    """min(1, p(x) / q(x)): the chance that the draft token x, drawn from q, is kept.

    Shapes: ``p, q: (V,)`` distributions, ``x`` a token with q(x) > 0 -> a float in [0, 1]."""
    return min(1.0, p[x] / q[x])


def residual(p, q):
    """norm(max(0, p − q)): what a rejected step draws from, the mass p has beyond q.

    Shapes: ``p, q: (V,)`` -> ``(V,)``, summing to 1. Its total Σ max(0, p − q) = 1 − Σ min(p, q)
    is the chance of a rejection, so it is 0 only where p = q, where no draft is rejected; a
    rejection that rounding made possible there draws from p itself."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 0 else p


def verify(p, q, drafts, rng):
    """One round's rule: ``(a, y)``, the number of drafts accepted and the token that follows them.

    Shapes: ``p: (k + 1, V)`` the target's distributions, ``q: (k, V)`` the draft's, ``drafts:
    (k,)`` with d_i ~ q_i. d_i is kept when u_i < min(1, p_i(d_i)/q_i(d_i)), u_i ~ U[0, 1); the
    first rejection at i draws y from the residual of p_i and q_i; after k acceptances, from
    p_{k+1}.
    """
    for i, d in enumerate(drafts):
        if not rng.random() < accept_probability(p[i], q[i], d):
            return i, int(draw(residual(p[i], q[i])[None], rng)[0])           # rejected at i
    k = len(drafts)
    return k, int(draw(p[k][None], rng)[0])                                    # the bonus token


def round_size(k, t, remaining, max_len_target, max_len_draft):
    """The drafts of a round after ``t`` tokens: at most k, at most ``remaining`` − 1 (the round
    also writes y), the target scoring positions up to t + k − 1 < its max_len, the draft
    reading up to position t + k − 2 < its max_len; 0 when there is no room to propose."""
    return max(0, min(k, remaining - 1, max_len_target - t, max_len_draft - t + 1))


@dataclass
class Stats:
    """What the rounds did: ``proposed[r]`` drafts in round r, ``accepted[r]`` of them kept;
    ``plain``: tokens sampled without drafts after the target's window was full."""
    proposed: list = field(default_factory=list)
    accepted: list = field(default_factory=list)
    plain: int = 0

    @property
    def acceptance_rate(self):
        """α = accepted / tested: the drafts kept among those the rule looked at (after the first
        rejection of a round, the rest are never tested); NaN before any draft was tested."""
        tested = sum(min(k, a + 1) for k, a in zip(self.proposed, self.accepted))
        return sum(self.accepted) / tested if tested else float("nan")


def _check(target, draft, prompt, max_new_tokens, lookahead):
    for name, model in (("target", target), ("draft", draft)):
        if not kv_cache.supports(model):
            raise ValueError(f"{name}: expected a model that decodes with a KV cache "
                             f"(tformer.decoding.kv_cache.supports), got {type(model).__name__}")
    V, V_q = target.config["vocab_size"], draft.config["vocab_size"]
    if V_q != V:
        raise ValueError(f"draft: expected the target's vocabulary of {V} tokens, got {V_q}")
    generate.check_decode(target, prompt, max_new_tokens)
    if prompt.shape[0] != 1:
        raise ValueError(f"prompt: expected one sequence (batch 1), got shape {prompt.shape}")
    if isinstance(lookahead, bool) or not isinstance(lookahead, (int, np.integer)) or lookahead < 1:
        raise ValueError(f"lookahead: expected an integer ≥ 1, got {lookahead!r}")


def speculative_sample(target, draft, prompt, max_new_tokens, lookahead=4, temperature=1.0,
                       top_k=None, top_p=None, min_p=None, seed=0, rng=None):
    """x ~ p (the target's filtered sampling), written ``lookahead`` drafts at a time.

    Shapes: ``prompt: (1, T0)`` ints -> ``((1, T0 + max_new_tokens) ints, Stats)``. The samplers
    are ``tformer.decoding.generate.sample``'s (``temperature=0``: greedy); the draws come from ``rng`` or
    ``np.random.default_rng(seed)``. Both models run in eval mode and get their mode back.
    """
    _check(target, draft, prompt, max_new_tokens, lookahead)
    check_sampling(temperature, top_k, top_p, min_p)
    gen = generate.rng_of(seed, rng)
    modes = target.training, draft.training
    target.eval(), draft.eval()
    try:
        return _rounds(target, draft, prompt, max_new_tokens, lookahead, gen,
                       dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p))
    finally:
        target.train(modes[0]), draft.train(modes[1])


def _rounds(target, draft, prompt, max_new_tokens, k, rng, filters):
    out, stats = prompt.astype(np.int64), Stats()                             # (1, t)
    caches_p, caches_q = kv_cache.new_caches(target, 1), kv_cache.new_caches(draft, 1)
    end = out.shape[1] + max_new_tokens
    while out.shape[1] < end and out.shape[1] <= target.max_len:
        t = out.shape[1]
        k_r = round_size(k, t, end - t, target.max_len, draft.max_len)
        drafts, q = _propose(draft, caches_q, out, k_r, rng, filters)          # (k_r,), (k_r, V)
        fed = np.concatenate([out[:, caches_p[0].t:], drafts[None]], axis=1)   # (1, ·)
        logits = target.forward(fed, kv_cache=caches_p)                        # (1, ·, V)
        p = probabilities(logits[0, -(k_r + 1):], **filters)                   # (k_r + 1, V)
        a, y = verify(p, q, drafts, rng)
        out = np.concatenate([out, drafts[None, :a], [[y]]], axis=1)           # (1, t + a + 1)
        for cache in caches_p + caches_q:                                      # forget the rejected
            cache.crop(min(cache.t, t + a))
        stats.proposed.append(k_r), stats.accepted.append(a)
    if out.shape[1] < end:                                                     # the window is full
        stats.plain = end - out.shape[1]
        out = generate.sample(target, out, stats.plain, rng=rng, **filters)
    return out.astype(prompt.dtype, copy=False), stats


def _propose(draft, caches_q, out, k, rng, filters):
    """k drafts d_i ~ q_i, each fed back to the draft but the last: ``((k,), (k, V))``."""
    drafts, q = np.zeros(k, np.int64), []
    fed = out[:, caches_q[0].t:]                                               # not yet cached
    for i in range(k):
        logits = draft.forward(fed, kv_cache=caches_q)                         # (1, ·, V)
        q.append(probabilities(logits[0, -1:], **filters)[0])                  # q_i: (V,)
        drafts[i] = draw(q[i][None], rng)[0]                                   # d_i ~ q_i
        fed = drafts[None, i:i + 1]                                            # (1, 1)
    return drafts, np.array(q)
