"""Speculative decoding (tformer.decoding.speculative) writes exactly the target's filtered distribution.

(a) SymPy: accepted-or-residual gives p, region by region of the signs of p − q (V = 3 and 4),
    and the module's rule is those expressions. (b) Exact enumeration on tiny TinyGPTs: every draft
    proposal and every accept/reject branch of the rounds, with the module's own functions, gives
    the target's autoregressive distribution of the first three tokens to 1e-12. (c) A planted
    error in the rule (min(1, q/p), or no residual) makes (b) fail, and the sampled frequencies of
    (e) too. (d) Temperature 0 is greedy decoding token for token, k = 1, 2, 4, also past max_len.
    (e) Sampled first-two-token frequencies against the exact distribution (chi-square). (f) The
    quantized, LoRA and modern-block models as draft or target. And KVCache.crop.
"""
import itertools
from collections import defaultdict

import mpmath
import numpy as np
import pytest
import sympy as sp

from tformer.decoding import kv_cache, speculative
from tformer.nn.attention import KVCache
from tformer.decoding.generate import greedy
from tformer.nn.lora import apply_lora
from tformer.models.tinygpt import TinyGPT
from tformer.decoding.samplers import probabilities
from tformer.decoding.quantize import quantize_model
from tformer.decoding.speculative import speculative_sample


def randomized(model, seed, scale, like=None):
    """``model`` with N(0, scale²) noise added to every parameter (to ``like``'s values if given,
    so that it is a draft near ``like``; else to its own, so that norm gains stay near 1)."""
    rng = np.random.default_rng(seed)
    bases = like.named_parameters() if like is not None else model.named_parameters()
    for (_, p, _), (_, base, _) in zip(model.named_parameters(), list(bases)):
        p[...] = base + rng.standard_normal(p.shape) * scale
    return model


def tiny_pair(dtype=np.float64, max_len=8, **kw):
    """A tiny target (V = 5, one layer, d_model 8) with peaked distributions and a draft near it."""
    cfg = dict(d_model=8, n_heads=2, n_layers=1, max_len=max_len, vocab_size=5, dtype=dtype, **kw)
    target = randomized(TinyGPT(seed=0, **cfg), 1, 0.3)
    draft = randomized(TinyGPT(seed=0, **cfg), 2, 0.1, like=target)
    return target.eval(), draft.eval()


# (a) the proof -----------------------------------------------------------------------------------

@pytest.mark.parametrize("V", [3, 4])
def test_sympy_accepted_or_residual_is_p_in_every_region(V):
    ps, qs = sp.symbols(f"p1:{V}", positive=True), sp.symbols(f"q1:{V}", positive=True)
    p, q = [*ps, 1 - sum(ps)], [*qs, 1 - sum(qs)]
    rng, regions = np.random.default_rng(0), 0
    for above in itertools.product([True, False], repeat=V):     # above[v]: p_v ≥ q_v
        if all(above) or not any(above):                          # both sum to 1: then p = q
            continue
        accept = [1 if a else p[v] / q[v] for v, a in enumerate(above)]     # min(1, p/q)
        excess = [p[v] - q[v] if a else 0 for v, a in enumerate(above)]     # max(0, p − q)
        reject = 1 - sum(q[v] * accept[v] for v in range(V))
        for x in range(V):
            out = q[x] * accept[x] + reject * excess[x] / sum(excess)
            assert sp.simplify(out - p[x]) == 0
        # the module's rule is these expressions, at a point of the region
        pn, qn = _point_in(above, rng)
        subs = dict(zip(ps + qs, [*pn[:-1], *qn[:-1]]))
        res = speculative.residual(pn, qn)
        for x in range(V):
            assert abs(speculative.accept_probability(pn, qn, x) - float(accept[x].subs(subs)
                       if accept[x] != 1 else 1)) < 1e-15
            assert abs(res[x] - float(sp.sympify(excess[x]).subs(subs) / sum(excess).subs(subs))) \
                < 1e-14
        regions += 1
    assert regions == 2 ** V - 2
    # p = q: nothing is rejected, every draft is kept
    pn = np.array([0.2, 0.3, 0.5])
    assert all(speculative.accept_probability(pn, pn.copy(), x) == 1 for x in range(3))


def _point_in(above, rng):
    """Two distributions with p_v ≥ q_v exactly where ``above`` says (rejection sampling)."""
    while True:
        p, q = rng.dirichlet(np.ones(len(above))), rng.dirichlet(np.ones(len(above)))
        if ((p >= q) == np.array(above)).all():
            return p, q


# (b) exact enumeration ---------------------------------------------------------------------------

class Exact:
    """Exact distributions of the next ``n`` tokens after a context, by full forward passes."""

    def __init__(self, target, draft, filters):
        self.models, self.filters, self.memo = {"p": target, "q": draft}, filters, {}

    def dist(self, which, ctx):
        key = (which, ctx)
        if key not in self.memo:
            logits = self.models[which].forward(np.array([ctx]))[0, -1:]         # (1, V)
            self.memo[key] = probabilities(logits, **self.filters)[0]
        return self.memo[key]

    def target(self, ctx, n):
        """{next n tokens: Π_t p(x_t | ctx, x_<t)}: the target sampling alone."""
        if n == 0:
            return {(): 1.0}
        out = {}
        for x, px in enumerate(self.dist("p", ctx)):
            if px > 0:
                for tail, pr in self.target(ctx + (x,), n - 1).items():
                    out[(x,) + tail] = px * pr
        return out

    def speculative(self, ctx, n, k):
        """The same under speculative decoding: every draft sequence d ~ q, every branch of the
        round (i accepted, then a rejection and the residual, or the bonus token), and the rounds
        that follow, with tformer.decoding.speculative's round_size, accept_probability and residual."""
        if n == 0:
            return {(): 1.0}
        p_net, q_net = self.models["p"], self.models["q"]
        k_r = speculative.round_size(k, len(ctx), n, p_net.max_len, q_net.max_len)
        out = defaultdict(float)
        for drafts, reach in self._proposals(ctx, k_r):
            for i in range(k_r + 1):                      # the first i drafts accepted
                p_i = self.dist("p", ctx + drafts[:i])
                if i < k_r:
                    q_i = self.dist("q", ctx + drafts[:i])
                    a = speculative.accept_probability(p_i, q_i, drafts[i])
                    y_dist = reach * (1 - a) * speculative.residual(p_i, q_i)
                else:
                    y_dist = reach * p_i                          # all accepted: the bonus
                for y in np.flatnonzero(y_dist):
                    emitted = drafts[:i] + (int(y),)
                    for tail, pr in self.speculative(ctx + emitted, n - len(emitted), k).items():
                        out[emitted + tail] += y_dist[y] * pr
                if i < k_r:
                    reach *= a
        return dict(out)

    def _proposals(self, ctx, k):
        """Every draft sequence of length k with its probability Π q_i(d_i)."""
        if k == 0:
            yield (), 1.0
            return
        for head, pr in self._proposals(ctx, k - 1):
            q = self.dist("q", ctx + head)
            for d in np.flatnonzero(q > 0):
                yield head + (int(d),), pr * q[d]


def tv_gap(a, b):
    """max_x |a(x) − b(x)| over the union of their supports."""
    return max(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b))


FILTERS = [dict(temperature=1.0), dict(temperature=0.8, top_k=4, top_p=0.9, min_p=0.1),
           dict(temperature=0.0)]


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("filters", FILTERS, ids=["plain", "filtered", "greedy"])
def test_exact_distribution_of_three_tokens_is_the_targets(filters, k):
    target, draft = tiny_pair()
    exact, ctx = Exact(target, draft, filters), (1, 3)
    want, got = exact.target(ctx, 3), exact.speculative(ctx, 3, k)
    assert abs(sum(got.values()) - 1) < 1e-12 and len(want) > (1 if filters["temperature"] else 0)
    assert tv_gap(got, want) < 1e-12
    if filters["temperature"]:      # and the draft is not the target: its own text differs
        assert tv_gap(exact.target(ctx, 1), {(x,): q for x, q in enumerate(exact.dist("q", ctx))}) \
            > 0.05


# (c) a planted error is caught -----------------------------------------------------------------

def _inverted(p, q, x):
    return min(1.0, q[x] / p[x]) if p[x] > 0 else 1.0           # min(1, q/p): the ratio upside down


PLANTED = {"min(1, q/p)": ("accept_probability", _inverted),
           "no residual": ("residual", lambda p, q: p)}                 # a rejection draws from p


@pytest.mark.parametrize("error", sorted(PLANTED))
def test_a_planted_error_in_the_rule_fails_the_exact_check(error, monkeypatch):
    target, draft = tiny_pair()
    exact = Exact(target, draft, dict(temperature=1.0))
    assert tv_gap(exact.speculative((1, 3), 3, 2), exact.target((1, 3), 3)) < 1e-12
    monkeypatch.setattr(speculative, *PLANTED[error])
    exact.memo.clear()
    assert tv_gap(exact.speculative((1, 3), 3, 2), exact.target((1, 3), 3)) > 1e-3


# (d) greedy -------------------------------------------------------------------------------------

def small_pair(dtype=np.float32, **kw):
    """A target (V = 40, two blocks) and a draft of the same shape near it (so some drafts are
    accepted and some not)."""
    cfg = dict(d_model=16, n_heads=4, n_layers=2, max_len=24, vocab_size=40, dtype=dtype, **kw)
    target = randomized(TinyGPT(seed=0, **cfg), 3, 0.3)
    draft = randomized(TinyGPT(seed=0, **cfg), 4, 0.08, like=target)
    return target, draft


@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_speculative_decoding_is_greedy_decoding(k):
    target, draft = small_pair()
    prompt = np.array([[5, 1, 7]])
    for n in (12, 30):                                  # 30: past max_len = 24, the window slides
        out, stats = speculative_sample(target, draft, prompt, n, lookahead=k, temperature=0)
        assert np.array_equal(out, greedy(target, prompt, n))
        assert out.shape == (1, 3 + n) and sum(stats.accepted) + len(stats.accepted) \
            + stats.plain == n
    assert 0 < sum(stats.accepted) < sum(stats.proposed)       # both branches ran
    assert stats.plain == 3 + 30 - target.max_len - 1


def test_a_draft_that_is_the_target_is_always_accepted():
    target, _ = small_pair(np.float64)
    out, stats = speculative_sample(target, target, np.array([[2]]), 15, lookahead=3, seed=1)
    assert stats.accepted == stats.proposed and stats.acceptance_rate == 1.0
    assert stats.proposed == [3, 3, 3, 2]                            # 4 + 4 + 4 + 3 tokens


# (e) sampled against the exact distribution -----------------------------------------------------

def chi_square_p_value(counts, probs, least=5.0):
    """Pearson's chi-square test of ``counts`` against ``probs``, cells of expected count below
    ``least`` pooled into one; returns P(χ² ≥ statistic)."""
    n = counts.sum()
    expected = probs * n
    small = expected < least
    obs = np.append(counts[~small], counts[small].sum())
    exp_ = np.append(expected[~small], expected[small].sum())
    keep = exp_ > 0
    stat = (((obs - exp_) ** 2)[keep] / exp_[keep]).sum()
    dof = keep.sum() - 1
    return float(mpmath.gammainc(dof / 2, stat / 2, mpmath.inf, regularized=True)), dof


def first_two_counts(target, draft, filters, draws):
    counts = np.zeros(25)
    rng = np.random.default_rng(7)
    for _ in range(draws):
        out, _ = speculative_sample(target, draft, np.array([[1, 3]]), 3, lookahead=2, rng=rng,
                                    **filters)
        counts[out[0, 2] * 5 + out[0, 3]] += 1
    return counts


DRAWS = 3000


def test_sampled_first_two_tokens_follow_the_target():
    """False-alarm rate 1e-3 (the threshold on the p-value); seeded, so one fixed outcome."""
    target, draft = tiny_pair()
    filters = dict(temperature=0.9, top_k=4, min_p=0.05)
    want = Exact(target, draft, filters).target((1, 3), 2)
    probs = np.array([want.get((a, b), 0.0) for a in range(5) for b in range(5)])
    counts = first_two_counts(target, draft, filters, DRAWS)
    assert counts[probs == 0].sum() == 0                               # never outside the filters
    p_value, dof = chi_square_p_value(counts, probs)
    assert dof >= 5 and p_value > 1e-3


def test_a_planted_error_fails_the_sampled_check_too(monkeypatch):
    """The loop calls the rule the enumeration checks: the planted min(1, q/p) shows in samples."""
    monkeypatch.setattr(speculative, "accept_probability", _inverted)
    target, draft = tiny_pair()
    filters = dict(temperature=0.9, top_k=4, min_p=0.05)
    want = Exact(target, draft, filters).target((1, 3), 2)
    probs = np.array([want.get((a, b), 0.0) for a in range(5) for b in range(5)])
    p_value, _ = chi_square_p_value(first_two_counts(target, draft, filters, DRAWS), probs)
    assert p_value < 1e-6


# (f) every layer type as draft or target --------------------------------------------------------

def variant(kind, model):
    """``model`` as ``kind`` makes it: float, int8 weights (w8), LoRA adapters that change it."""
    if kind == "w8":
        quantize_model(model, "w8")
    elif kind == "lora":
        apply_lora(model, 2, targets=("attn", "mlp"), seed=1)
        rng = np.random.default_rng(9)
        for name, p, _ in model.named_parameters():
            if "lora" in name:
                p[...] = rng.standard_normal(p.shape) * 0.1
    return model.eval()


MODERN = dict(norm="rmsnorm", positions="rope", mlp="swiglu", n_kv_heads=2)


@pytest.mark.parametrize("kind, role", [("w8", "target"), ("w8", "draft"), ("lora", "target"),
                                        ("lora", "draft"), ("modern", "both")])
def test_every_layer_type_decodes_speculatively_as_draft_or_target(kind, role):
    target, draft = small_pair(**(MODERN if kind == "modern" else {}))
    if kind != "modern":
        if role == "target":
            target = variant(kind, target)
        else:
            draft = variant(kind, draft)
    prompt = np.array([[4, 9]])
    out, stats = speculative_sample(target, draft, prompt, 16, lookahead=3, temperature=0)
    assert np.array_equal(out, greedy(target, prompt, 16))
    assert sum(stats.accepted) > 0


# the cache's roll-back, and bad input ------------------------------------------------------------

def test_crop_forgets_positions_and_the_next_append_writes_after_them():
    rng = np.random.default_rng(0)
    k1, v1, k2, v2, k3, v3 = (rng.standard_normal((1, 2, n, 4)) for n in (3, 3, 2, 2, 1, 1))
    cache, fresh = KVCache(1, 2, 8, 4, np.float64), KVCache(1, 2, 8, 4, np.float64)
    cache.append(k1, v1), cache.append(k2, v2)
    cache.crop(3)
    K, V = cache.append(k3, v3)
    fresh.append(k1, v1)
    K_f, V_f = fresh.append(k3, v3)
    assert cache.t == 4 and np.array_equal(K, K_f) and np.array_equal(V, V_f)
    cache.crop(0)
    assert cache.t == 0
    for bad in (5, -1, 1.0, True):
        with pytest.raises(ValueError, match=r"t: expected an integer from 0 to the 0 positions"):
            cache.crop(bad)


def test_a_cropped_model_cache_gives_the_logits_of_a_fresh_one():
    target, _ = small_pair(np.float64, **MODERN)                       # RoPE: positions continue
    caches, fresh = kv_cache.new_caches(target, 1), kv_cache.new_caches(target, 1)
    target.forward(np.array([[1, 2, 3, 4, 5]]), kv_cache=caches)
    for c in caches:
        c.crop(2)
    target.forward(np.array([[1, 2]]), kv_cache=fresh)
    np.testing.assert_allclose(target.forward(np.array([[9, 8]]), kv_cache=caches),
                               target.forward(np.array([[9, 8]]), kv_cache=fresh),
                               rtol=0, atol=1e-13)


@pytest.mark.parametrize("change, words", [
    (lambda t, d, kw: kw.update(lookahead=0), "lookahead: expected an integer ≥ 1, got 0"),
    (lambda t, d, kw: kw.update(prompt=np.zeros((2, 3), np.int64)),
     "prompt: expected one sequence (batch 1), got shape (2, 3)"),
    (lambda t, d, kw: kw.update(draft=TinyGPT(d_model=8, n_layers=1, vocab_size=7)),
     "draft: expected the target's vocabulary of 40 tokens, got 7"),
    (lambda t, d, kw: kw.update(target=object()), "target: expected a model that decodes with"),
    (lambda t, d, kw: kw.update(top_p=0.0), "top_p: expected a probability mass in (0, 1], got 0"),
    (lambda t, d, kw: kw.update(min_p=2), "min_p: expected a fraction"),
])
def test_bad_input_names_the_argument(change, words):
    target, draft = small_pair()
    kw = dict(target=target, draft=draft, prompt=np.array([[1]]), max_new_tokens=3)
    change(target, draft, kw)
    with pytest.raises(ValueError) as e:
        speculative_sample(**kw)
    assert words in str(e.value)
