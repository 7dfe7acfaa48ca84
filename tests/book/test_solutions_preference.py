"""The worked solutions of the exercises of the chapter "Preference tuning: lines that scan"
(notebooks/35_preference.ipynb): every number a solution states, checked with the package's DPO
kernels, the judge, the experiment's file, and SymPy where a solution is exact."""
import json
import math
from pathlib import Path

import numpy as np
import sympy as sp

from tformer.data import meter
from tformer.tuning.dpo import dpo_backward, dpo_forward
from tformer.experiments.preference import wilson
from tformer.kernels.losses import log_softmax

DATA = Path(__file__).resolve().parents[2] / "book" / "data"


def test_35_1_the_weight_of_a_pair_is_sigma_of_minus_beta_delta():
    def weight(u):
        return 1 / (1 + math.exp(u))
    assert weight(0) == 0.5
    assert round(weight(3), 3) == 0.047
    u = math.log(99)
    assert round(u, 3) == 4.595 and abs(weight(u) - 0.01) < 1e-15
    assert round(u / 0.1, 2) == 45.95


def test_35_2_beta_to_infinity_keeps_the_reference_and_to_zero_takes_the_best():
    beta = sp.Symbol("beta", positive=True)
    ref = [sp.Rational(1, 5), sp.Rational(1, 2), sp.Rational(3, 10)]
    r = [1, 0, 0]
    tilted = [q * sp.exp(ri / beta) for q, ri in zip(ref, r)]
    pi = [t / sum(tilted) for t in tilted]
    assert [sp.limit(p, beta, sp.oo) for p in pi] == ref
    assert [sp.limit(p, beta, 0, "+") for p in pi] == [1, 0, 0]


def test_35_3_the_first_dpo_step_is_beta_over_two_times_contrastive_sft():
    rng = np.random.default_rng(0)
    B, T, V, beta = 2, 4, 6, 0.1
    zw, zl = rng.standard_normal((B, T, V)), rng.standard_normal((B, T, V))
    tw, tl = rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))
    mw = ml = np.array([[False, True, True, True], [False, False, True, True]])

    def logp(z, t, m):
        return np.where(m, np.take_along_axis(log_softmax(z), t[..., None], -1)[..., 0], 0).sum(1)
    # π = π_ref: the reference's log-probabilities are the policy's own
    _, cache = dpo_forward(zw, tw, mw, zl, tl, ml, logp(zw, tw, mw), logp(zl, tl, ml), beta)
    assert np.allclose(cache.sig, 0.5)
    dw, dl = dpo_backward(np.ones(B), cache)

    def d_neg_logp(z, t, m):                        # ∂(−log π(y))/∂z = m (softmax − onehot)
        return (np.exp(log_softmax(z)) - (np.arange(V) == t[..., None])) * m[..., None]
    assert np.allclose(dw, beta / 2 * d_neg_logp(zw, tw, mw), atol=1e-15)
    assert np.allclose(dl, -beta / 2 * d_neg_logp(zl, tl, ml), atol=1e-15)


def test_35_4_best_of_n_falls_below_the_alike_prompts_formula():
    base = json.loads((DATA / "preference.json").read_text())["base"]
    p = base["best_of"]["1"]
    assert round(p, 3) == 0.223
    formula = {n: 1 - (1 - p) ** n for n in (2, 4, 8)}
    assert [round(formula[n], 2) for n in (2, 4, 8)] == [0.40, 0.64, 0.87]
    measured = [base["best_of"][str(n)] for n in (2, 4, 8)]
    assert [round(m, 2) for m in measured] == [0.39, 0.56, 0.80]
    assert all(m < formula[n] for m, n in zip(measured, (2, 4, 8)))
    # as intervals they overlap: p's own 95 % Wilson interval over the prompts (one line each)
    # carries the formula to an interval that meets each measured rate's at every n
    prompts = json.loads((DATA / "preference.json").read_text())["config"]["eval_prompts"]
    intervals = [wilson(m * prompts, prompts) for m in measured]
    p_lo, p_hi = wilson(p * prompts, prompts)
    assert (round(p_lo, 3), round(p_hi, 3)) == (0.180, 0.274)
    for (lo, hi), n in zip(intervals, (2, 4, 8)):
        assert 1 - (1 - p_lo) ** n <= hi and lo <= 1 - (1 - p_hi) ** n
    # alike prompts simulated (p and best-of-n from the same lines): a shortfall as large as
    # the measured one is common at n = 2, rare (under 5 %) at n = 4 and 8
    rng, draws, hits = np.random.default_rng(0), 20_000, {2: 0, 4: 0, 8: 0}
    for _ in range(10):
        drawn = rng.random((draws // 10, prompts, 8)) < p
        p_hat = drawn[:, :, 0].mean(axis=1)
        for n, m in zip((2, 4, 8), measured):
            gap = 1 - (1 - p_hat) ** n - drawn[:, :, :n].any(axis=2).mean(axis=1)
            hits[n] += int((gap >= formula[n] - m - 1e-9).sum())
    assert hits[2] / draws > 0.2 and hits[4] / draws < 0.05 and hits[8] / draws < 0.05


def test_35_5_sonnet_18_s_second_line_breaks_the_rule_for_unstressed_syllables():
    first, second = ("Shall I compare thee to a summer's day?",
                     "Thou art more lovely and more temperate:")
    assert meter.scans(first) and not meter.scans(second)
    assert meter.stress_patterns("temperate") == ("10", "100")
    assert meter.syllables(second) == 9                 # with temp-rate
    before = sum(len(meter.stress_patterns(w)[0]) for w in meter.words(second)[:-1])
    assert before == 7                                   # tem-per-ate on positions 8, 9, 10
    # the line without the word's last syllable unstressed on 10 would scan: 'more temper' + 'ate'
    assert meter.scans("Thou art more lovely and more temper so")
