"""Beam search with a length penalty, and the exhaustive search that checks it on tiny vocabularies.

A hypothesis y = (y_1 … y_L) after the prompt x has the log-probability
s(y) = Σ_t log p(y_t | x, y_<t). Beam search keeps the ``beam_width`` best partial hypotheses by
s; a hypothesis is *finished* when it emits ``stop_token`` or reaches ``max_new_tokens`` tokens,
and finished ones are compared by the length-normalised score of GNMT (Wu et al., 2016, eq. 14):

    score(y) = s(y) / lp(L),    lp(L) = ((5 + L) / 6)^α,    L = generated tokens, stop included.

α = 0 gives the plain sum of log-probabilities (which favours short outputs); α > 0 divides a
negative sum by a number that grows with L, so longer hypotheses are penalised less.

Shapes follow ``tformer.decoding.generate.greedy``: ``prompt: (B, T0)`` ints -> ``(B, T0 + L_max)``, each
row followed by ``stop_token`` after it stops, so that ``beam_width=1`` and ``greedy`` return
equal arrays. All B prompts are searched at once, as B·k rows of one forward pass.
"""
import itertools

import numpy as np

from tformer.core.validate import index_range, int_array
from tformer.fast.losses import log_softmax, sequence_logp


def gnmt_penalty(length, alpha):
    """lp(L) = ((5 + L) / 6)^α (GNMT, the divisor of the ``length_penalty=α`` argument); lp(1) = 1."""
    return ((5.0 + np.asarray(length, dtype=np.float64)) / 6.0) ** alpha


def _logp(logits):
    """log p = log_softmax(z) over the last axis, in float64 (scores are summed over steps)."""
    return log_softmax(np.asarray(logits, dtype=np.float64))


def _check(prompt, beam_width, max_new_tokens, length_penalty, max_len=None, vocab_size=None,
           stop_token=None):
    """Every argument of a search, checked before any work; returns α = float(length_penalty)."""
    int_array("prompt", prompt, ndim=2)
    if prompt.shape[0] < 1 or prompt.shape[1] < 1:
        raise ValueError(f"prompt: expected at least one row of at least one token, got shape "
                         f"{prompt.shape}")
    if vocab_size is not None:
        index_range("prompt", prompt, 0, vocab_size)
    if isinstance(beam_width, bool) or not isinstance(beam_width, (int, np.integer)) or beam_width < 1:
        raise ValueError(f"beam_width: expected an integer ≥ 1, got {beam_width!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
            or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an integer ≥ 1, got {max_new_tokens!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float, np.integer,
                                                                           np.floating)):
        raise TypeError(f"length_penalty: expected a number α ≥ 0, got "
                        f"{type(length_penalty).__name__}")
    alpha = float(length_penalty)
    if not (np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"length_penalty: expected a finite α ≥ 0, got {alpha!r}")
    if stop_token is not None and (isinstance(stop_token, bool)
                                   or not isinstance(stop_token, (int, np.integer))
                                   or (vocab_size is not None and not 0 <= stop_token < vocab_size)):
        raise ValueError(f"stop_token: expected None or a token id in [0, {vocab_size}), "
                         f"got {stop_token!r}")
    T0 = prompt.shape[1]
    if max_len is not None and T0 + max_new_tokens - 1 > max_len:
        raise ValueError(f"prompt, max_new_tokens: beam search feeds up to T0 + max_new_tokens − 1 "
                         f"= {T0} + {max_new_tokens} − 1 = {T0 + max_new_tokens - 1} positions, "
                         f"more than the model's max_len = {max_len}; shorten the prompt or "
                         f"generate fewer tokens (beam search does not crop, unlike greedy)")
    return alpha


def beam_search(model, prompt, beam_width, max_new_tokens, length_penalty=0.0, stop_token=None,
                return_scores=False):
    """The best continuation of each prompt under score(y) = s(y) / lp(L) (see the module docstring).

    Each step scores the k·V extensions of the k live hypotheses by s and keeps the best k (ties
    go to the lower beam, then the lower token id, as ``argmax`` does). Extensions that end in
    ``stop_token`` or reach ``max_new_tokens`` tokens leave the beam as finished hypotheses;
    the search of a prompt ends when no live hypothesis can still beat its best finished one
    (for α ≥ 0 a live s can only fall, and s / lp(L) ≤ s / lp(max_new_tokens)).
    ``prompt: (B, T0)`` ints -> ``(B, T0 + L_max)`` ints; with ``return_scores`` also the (B,)
    normalised scores. The model runs in eval mode; its mode is restored afterwards. Every step
    recomputes the whole prefix (no KV cache), so T0 + max_new_tokens − 1 must fit the model's
    ``max_len``: a longer prompt is not cropped (unlike ``greedy``; scores over a sliding window
    would not be the s(y) above) but refused with a ValueError before any work, as is an empty
    prompt (B = 0 or T0 = 0). So are prompt ids outside the model's [0, vocab_size), a
    ``stop_token`` outside it, and a ``length_penalty`` that is not a finite number ≥ 0.
    """
    alpha = _check(prompt, beam_width, max_new_tokens, length_penalty, getattr(model, "max_len", None),
                   getattr(model, "vocab_size", None), stop_token)
    k, L = int(beam_width), int(max_new_tokens)
    seqs = np.repeat(prompt[:, None, :], k, axis=1)                      # (B, k, T0)
    scores = np.full((prompt.shape[0], k), -np.inf)                      # (B, k)
    scores[:, 0] = 0.0                                                   # one live beam at first
    best = _Finished(prompt, L, stop_token)
    was_training = model.training
    model.eval()
    try:
        for t in range(1, L + 1):
            logits = model.forward(seqs.reshape(-1, seqs.shape[2]))[:, -1]   # (B·k, V)
            seqs, scores, tok = _extend(seqs, scores, _logp(logits), k)
            # finished: the live hypotheses that emitted stop_token, or all of them at the last step
            done = np.isfinite(scores) & (t == L or (tok == stop_token if stop_token is not None else False))
            best.add(seqs, scores / float(gnmt_penalty(t, alpha)), done, t)
            scores[done] = -np.inf                                         # finished: out of the beam
            # s / lp(L) bounds what a live hypothesis can still reach: stop where it cannot win
            scores[best.score >= scores.max(axis=1) / float(gnmt_penalty(L, alpha))] = -np.inf
            if not np.isfinite(scores).any():
                break
    finally:
        model.train(was_training)
    out = best.seq[:, :prompt.shape[1] + int(best.length.max())]    # (B, T0 + L_max)
    return (out, best.score) if return_scores else out


def _extend(seqs, scores, logp, k):
    """Score the k·V extensions of the k hypotheses of each prompt by s + log p and keep the best
    k (ties: lower beam, then lower token id). ``seqs: (B, k, T)``, ``scores: (B, k)``,
    ``logp: (B·k, V)`` -> ``(seqs (B, k, T + 1), scores (B, k), tokens (B, k))``."""
    B, V = scores.shape[0], logp.shape[-1]
    cand = (scores[:, :, None] + logp.reshape(B, k, V)).reshape(B, k * V)    # (B, k·V)
    order = np.argsort(-cand, axis=1, kind="stable")[:, :k]               # (B, k) best extensions
    scores = np.take_along_axis(cand, order, axis=1)                       # (B, k)
    beam, tok = order // V, order % V                                      # (B, k) each
    seqs = np.concatenate([np.take_along_axis(seqs, beam[:, :, None], axis=1),
                           tok[:, :, None].astype(seqs.dtype)], axis=2)   # (B, k, T + 1)
    return seqs, scores, tok


class _Finished:
    """The best finished hypothesis of each prompt so far: its normalised ``score`` (B,), its
    tokens ``seq`` (B, T0 + L), followed by the stop token (or 0), and its ``length`` (B,)."""

    def __init__(self, prompt, L, stop_token):
        B, T0 = prompt.shape
        self.T0, self.fill = T0, stop_token if stop_token is not None else 0
        self.score = np.full(B, -np.inf)
        self.seq = np.full((B, T0 + L), self.fill, dtype=prompt.dtype)
        self.seq[:, :T0] = prompt
        self.length = np.zeros(B, dtype=np.int64)

    def add(self, seqs, norm, done, t):
        """Keep, per prompt, the best of the hypotheses ``done`` at step ``t`` (normalised scores
        ``norm: (B, k)``) if it beats the one kept."""
        norm = np.where(done, norm, -np.inf)                               # (B, k)
        j = norm.argmax(axis=1)                                            # (B,)
        top = norm[np.arange(norm.shape[0]), j]
        better = top > self.score
        self.score = np.where(better, top, self.score)
        self.seq[better, :self.T0 + t] = seqs[better, j[better]]
        self.seq[better, self.T0 + t:] = self.fill
        self.length[better] = t


def sequence_scores(model, prompt, continuations, length_penalty=0.0, stop_token=None):
    """score(y) = s(y) / lp(L) of each continuation, cut after its first ``stop_token``.

    ``prompt: (T0,)`` ints, ``continuations: (N, L)`` ints -> ``(scores (N,), lengths (N,))``;
    one forward pass over all N sequences. Integer arrays with ids in [0, V) (V = the model's
    ``vocab_size``) and N, L ≥ 1 are expected, else ValueError/TypeError naming the argument.
    """
    int_array("prompt", prompt, ndim=1)
    int_array("continuations", continuations, ndim=2)
    if prompt.size < 1 or continuations.shape[0] < 1 or continuations.shape[1] < 1:
        raise ValueError(f"prompt, continuations: expected T0 ≥ 1 and (N ≥ 1, L ≥ 1), got shapes "
                         f"{prompt.shape} and {continuations.shape}")
    V = getattr(model, "vocab_size", None)
    if V is not None:
        index_range("prompt", prompt, 0, V)
        index_range("continuations", continuations, 0, V)
    N, L = continuations.shape
    T0 = prompt.shape[0]
    seqs = np.concatenate([np.broadcast_to(prompt, (N, T0)), continuations], axis=1)   # (N, T0 + L)
    was_training = model.training
    model.eval()
    try:
        logp = _logp(model.forward(seqs[:, :-1])[:, T0 - 1:])              # (N, L, V)
    finally:
        model.train(was_training)
    lengths = np.full(N, L)
    if stop_token is not None:
        is_stop = continuations == stop_token
        lengths = np.where(is_stop.any(axis=1), is_stop.argmax(axis=1) + 1, L)
    counted = np.arange(L)[None, :] < lengths[:, None]                    # (N, L)
    s = sequence_logp(logp, continuations, counted)                        # (N,)
    return s / gnmt_penalty(lengths, float(length_penalty)), lengths


def exhaustive_search(model, prompt, max_new_tokens, length_penalty=0.0, stop_token=None):
    """The exact maximiser of score(y) over all V^L continuations (tiny V and L only: tests).

    ``prompt: (T0,)`` ints -> ``(tokens (T0 + L_best,), score)``. Continuations that share the part
    before their first ``stop_token`` are the same hypothesis and score the same; the first in
    lexicographic order is returned.
    """
    int_array("prompt", prompt, ndim=1)
    V = model.vocab_size
    alpha = _check(prompt[None, :], 1, max_new_tokens, length_penalty, None, V, stop_token)
    if V ** max_new_tokens > 200_000:
        raise ValueError(f"max_new_tokens: V^L = {V}^{max_new_tokens} continuations is too many")
    conts = np.array(list(itertools.product(range(V), repeat=max_new_tokens)), dtype=prompt.dtype)
    scores, lengths = sequence_scores(model, prompt, conts, alpha, stop_token)
    i = int(np.argmax(scores))
    return np.concatenate([prompt, conts[i, :lengths[i]]]), float(scores[i])


class MarkovTable:
    """A token "model" whose next-token log-probabilities depend on the last token only.

    ``log_probs: (V, V)`` with row a = log p(· | last token a). ``forward(tokens: (B, T)) -> (B, T, V)``.
    Small enough to work out by hand, so that a case where beam search beats greedy can be built
    on purpose (see the chapter).
    """

    def __init__(self, log_probs):
        self.table = np.asarray(log_probs, dtype=np.float64)
        if self.table.ndim != 2 or self.table.shape[0] != self.table.shape[1]:
            raise ValueError(f"log_probs: expected a square (V, V) table, got shape {self.table.shape}")
        self.vocab_size = self.table.shape[0]
        self.training = False

    def forward(self, tokens):
        int_array("tokens", tokens, ndim=2)
        return self.table[tokens]                                          # (B, T, V)

    def train(self, mode=True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)
