"""The worked solutions of the exercises of the chapter "Learning from the judge: policy gradients
and GRPO" (notebooks/37_grpo.ipynb): every number a solution states, checked with the package's
GRPO loss, the experiment's file, and SymPy where a solution is exact."""
import json
import math
from pathlib import Path

import numpy as np
import sympy as sp

from tformer.experiments.rl_frontier import read_at
from tformer.tuning.grpo import grpo_forward, group_advantages

DATA = Path(__file__).resolve().parents[2] / "book" / "data"


def _rl():
    return json.loads((DATA / "rl.json").read_text())


def test_37_1_a_fifth_of_the_base_groups_of_eight_teach_nothing():
    bo = _rl()["best_of"]
    k, m = np.array(bo["per_prompt"]["scans"]), bo["samples_per_prompt"]
    none = np.array([math.comb(m - j, 8) / math.comb(m, 8) for j in k])
    every = np.array([math.comb(j, 8) / math.comb(m, 8) for j in k])
    # unbiased: the mean of C(m − k, 8)/C(m, 8) over k ~ Bin(m, p) is (1 − p)^8
    for p in (0.1, 0.4):
        pmf = np.array([math.comb(m, j) * p ** j * (1 - p) ** (m - j) for j in range(m + 1)])
        est = np.array([math.comb(m - j, 8) / math.comb(m, 8) for j in range(m + 1)])
        assert abs(pmf @ est - (1 - p) ** 8) < 1e-14
    dead = (none + every).mean()
    naive = np.mean([(1 - j / m) ** 8 + (j / m) ** 8 for j in k])
    assert 0.1 < dead < 0.5 and dead < naive and none.mean() > 0.95 * dead
    dp = _rl()["dpo_pairs"]                  # a direct count: the reference's 8 lines a prompt
    assert dp["samples_per_prompt"] == 8 and 0 < dp["prompts"] - dp["prompts_with_a_pair"]


def test_37_2_a_lone_success_outweighs_each_failure_g_minus_one_times():
    G, k = sp.symbols("G k", positive=True)
    mean = k / G
    s = sp.sqrt((k * (1 - mean) ** 2 + (G - k) * mean ** 2) / (G - 1))
    assert sp.simplify(((1 - mean) / s) / (mean / s) - (G - k) / k) == 0
    A = group_advantages(np.array([[1.0] + [0.0] * 7]))
    assert abs(A[0] / -A[1] - 7) < 1e-12 and abs(A.sum()) < 1e-12
    assert abs(A[0] / math.sqrt(49 / 8) - 1) < 1e-3       # (1 − 1/8)/s, s + ε in the denominator


def test_37_3_on_policy_nothing_is_clipped_and_the_gradient_is_minus_w_a():
    rng = np.random.default_rng(5)
    lp = -rng.uniform(0.5, 3, (4, 5))
    mask = np.ones((4, 5), bool)
    mask[1, 3:] = False
    A = np.array([1.0, -0.5, 0.25, -0.75])
    for loss_type, w in (("grpo", 1 / (4 * mask.sum(axis=1))), ("dr_grpo", np.full(4, 1 / 20)),
                         ("bnpo", np.full(4, 1 / mask.sum()))):
        _, cache = grpo_forward(lp, None, None, mask, A, loss_type=loss_type)
        assert not cache.clipped.any() and np.all(cache.ratio == 1)
        assert np.allclose(cache.dlogp, np.where(mask, -(w * A)[:, None], 0), rtol=1e-15, atol=0)


def test_37_4_grpo_needs_tens_of_times_best_of_eights_kl_for_its_rate():
    r = _rl()
    b8 = r["best_of"]["by"]["lenient"]["8"]
    rows = r["analysis"]["frontiers"]["grpo"]
    kl = [x["kl_per_line"][0] for x in rows]
    rate = [x["rate"][0] for x in rows]
    assert read_at(kl, rate, b8["kl_per_line"]) < b8["rate"]
    # along the run, step by step: it crosses best-of-8's rate between two measured steps
    i = next(i for i, v in enumerate(rate) if v >= b8["rate"])
    assert rate[i - 1] < b8["rate"] <= rate[i]
    assert min(kl[i - 1], kl[i]) > 20 * b8["kl_per_line"]
