"""Scaling laws on one CPU: the solutions of the exercises, checked on the recorded files."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tformer.experiments import long_run as lr
from tformer.experiments import scaling_fit as sf

DATA = Path(__file__).resolve().parents[2] / "book" / "data"


@pytest.fixture(scope="module")
def recorded():
    sweep = json.loads((DATA / "scaling_sweep.json").read_text())
    run = json.loads((DATA / "long_run.json").read_text())
    shakespeare = json.loads((DATA / "shakespeare.json").read_text())
    return sweep, run, shakespeare


def t_quantile_2(p):
    """Student's t with 2 degrees of freedom: F(t) = 1/2 + t / (2 sqrt(2 + t²)), inverted."""
    q = 2 * p - 1
    return q * math.sqrt(2 / (1 - q * q))


def test_33_1_the_seed_spread_at_95_percent_leaves_the_miss_just_outside(recorded):
    _, run, shakespeare = recorded
    lo, hi = run["predicted_interval"]
    half, centre, val = (hi - lo) / 2, (hi + lo) / 2, run["val_nats_per_char"]
    s, seeds = shakespeare["summary"]["val_nats_std"], shakespeare["summary"]["seeds"]
    assert seeds == 3
    t2 = t_quantile_2(0.975)
    assert abs(t2 - 4.302653) < 1e-6                      # the tables' t_{0.975, 2}
    wide_t, wide_z = math.hypot(half, t2 * s), math.hypot(half, 1.959964 * s)
    assert wide_t - half > 0.5 * half                     # at 95 %, the seed term is not small
    assert val - centre > wide_t > wide_z                 # the measurement stays outside both
    assert val - (centre + wide_t) < 0.005                # but only just


def test_33_2_one_rung_moves_the_constants_within_their_intervals(recorded):
    sweep, run, _ = recorded
    runs = sweep["runs"]
    U = sweep["corpora"]["8192"]["train_tokens"]
    N, D, L = sf.arrays(runs)
    Dx = lr.effective_tokens(D, U)
    smallest = {b: min(r["n_weights"] for r in runs if r["budget"] == b) for b in {r["budget"] for r in runs}}
    keep = np.array([r["n_weights"] != smallest[r["budget"]] for r in runs])
    theta12, _ = sf.fit(N[keep], Dx[keep], L[keep])
    c12, c15 = sf.constants(theta12), sf.constants(np.array(run["fit"]["theta"]))
    ci = {k: run["fit"]["constants"][k]["interval"] for k in ("alpha", "beta")}
    assert all(ci[k][0] <= c12[k] <= ci[k][1] for k in ci)            # inside the 95 % intervals
    assert c12["alpha"] > c15["alpha"] and c12["beta"] < c15["beta"]
    assert c12["beta"] - ci["beta"][0] < 0.05 * (ci["beta"][1] - ci["beta"][0])   # at the edge
    plan = run["plan"]
    p12 = float(sf.predict(theta12, plan["n_weights"], lr.effective_tokens(plan["tokens"], U)))
    pred, val = run["predicted_nats_per_char"], run["val_nats_per_char"]
    lo, hi = run["predicted_interval"]
    assert abs(p12 - pred) < (hi - lo) / 2 / 5                        # under a fifth of its half-width
    assert abs(val - p12) > abs(val - pred)


def test_33_3_the_law_as_if_new_was_further_off(recorded):
    _, run, _ = recorded
    wr, plan = run["without_repetition"], run["plan"]
    assert wr["best"]["n_weights"] < plan["n_weights"] and wr["best"]["epochs"] > 2 * plan["epochs"]
    val, pred = run["val_nats_per_char"], run["predicted_nats_per_char"]
    lo, hi = run["predicted_interval"]
    # its own choice (2x64) never ran; on the model that did, with D taken as new tokens
    N, D = plan["n_weights"], plan["tokens"]
    on_run = float(sf.predict(np.array(wr["theta"]), N, D))
    on_run_lo, on_run_hi = sf.interval(sf.predict_samples(np.array(wr["bootstrap"]), N, D))
    assert on_run_lo < on_run < on_run_hi
    assert wr["predicted"] < on_run < pred < val                       # further below the measured
    assert on_run_hi < hi < val                                       # both intervals miss it
