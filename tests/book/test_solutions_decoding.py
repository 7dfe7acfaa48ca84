"""The worked solutions of the exercises of the chapter "Decoding: what the samplers keep, and
speculative decoding" (notebooks/34_decoding.ipynb): every number a solution states, checked with
the package's samplers and speculative rule, and SymPy where a solution is exact."""
import math

import numpy as np
import sympy as sp

from tformer.experiments.decoding import predicted_speedup, tokens_per_round
from tformer.decoding.samplers import filter_logits, probabilities
from tformer.decoding.speculative import residual


def test_34_1_min_p_keeps_a_window_of_tau_ln_one_over_m():
    z = np.array([[3.0, 1.0, 0.2, -0.8]])
    assert round(math.log(10), 3) == 2.303 and round(1.5 * math.log(10), 3) == 3.454
    gaps = z.max() - z[0]
    assert np.allclose(gaps, [0.0, 2.0, 2.8, 3.8])
    kept = {tau: np.isfinite(filter_logits(z, temperature=tau, min_p=0.1)[0]) for tau in (1.0, 1.5)}
    assert kept[1.0].tolist() == [True, True, False, False]
    assert kept[1.5].tolist() == [True, True, True, False]
    for tau, keep in kept.items():                     # the window is the rule
        assert np.array_equal(keep, gaps <= tau * math.log(10))


def _alpha(p, q):
    return sum(min(a, b) for a, b in zip(p, q))


def test_34_2_a_draft_that_does_not_filter_is_still_exact_but_accepted_less():
    p = np.log(np.array([[0.5, 0.3, 0.2]]))
    q = np.log(np.array([[0.4, 0.35, 0.25]]))
    p_f, q_f = probabilities(p, top_k=2)[0], probabilities(q, top_k=2)[0]
    assert np.allclose(p_f, [0.625, 0.375, 0.0]) and np.allclose(q_f, [8 / 15, 7 / 15, 0.0])
    exact = sp.Rational(8, 15) + sp.Rational(3, 8)
    assert exact == sp.Rational(109, 120) and round(float(exact), 3) == 0.908
    assert abs(_alpha(p_f, q_f) - float(exact)) < 1e-12
    q_raw = probabilities(q)[0]
    assert abs(_alpha(p_f, q_raw) - 0.75) < 1e-12
    # exact all the same: accepted min(p', q) plus the residual's share of the rejections is p'
    accepted = np.minimum(p_f, q_raw)
    out = accepted + (1 - accepted.sum()) * residual(p_f, q_raw)
    assert np.allclose(out, p_f, atol=1e-12)


def test_34_3_the_best_lookahead_and_the_free_draft_ceiling():
    S = {k: predicted_speedup(0.7, k, 0.2) for k in range(1, 9)}
    assert [round(S[k], 3) for k in (1, 2, 3, 4)] == [1.417, 1.564, 1.583, 1.541]
    assert max(S, key=S.get) == 3 and round(S[3], 2) == 1.58
    free = [tokens_per_round(0.7, k) for k in range(1, 60)]
    assert all(a < b for a, b in zip(free, free[1:])) and abs(free[-1] - 1 / 0.3) < 1e-8
    assert round(1 / 0.3, 2) == 3.33


def test_34_4_the_planted_rule_writes_the_drafts_distribution_here():
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.5, 0.3])
    accepted = q * np.minimum(1.0, q / p)
    assert np.allclose(accepted, [0.2 / 3, 0.5, 0.3])
    assert round(accepted.sum(), 4) == 0.8667 and round(1 - accepted.sum(), 4) == 0.1333
    r = residual(p, q)
    assert np.allclose(r, [1.0, 0.0, 0.0])
    out = accepted + (1 - accepted.sum()) * r
    assert np.allclose(out, q) and not np.allclose(out, p)
