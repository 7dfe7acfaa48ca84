"""Scaling laws on one CPU: the solutions of the exercises, checked on the recorded files."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tformer.experiments import long_run as lr
from tformer.experiments import scaling_fit as sf

DATA = Path(__file__).resolve().parents[1] / "book" / "data"


@pytest.fixture(scope="module")
def recorded():
    sweep = json.loads((DATA / "scaling_sweep.json").read_text())
    run = json.loads((DATA / "long_run.json").read_text())
    return sweep, run


def test_33_1_the_seed_spread_does_not_cover_the_miss(recorded):
    _, run = recorded
    lo, hi = run["predicted_interval"]
    half, val = (hi - lo) / 2, run["val_nats_per_char"]
    wide = math.hypot(half, 0.008)
    assert wide - half < 0.1 * half                       # the seed spread adds little
    assert abs(val - (lo + hi) / 2) > wide                # and the measurement stays outside


def test_33_2_one_rung_moves_the_constants_not_the_prediction(recorded):
    sweep, run = recorded
    runs = sweep["runs"]
    U = sweep["corpora"]["8192"]["train_tokens"]
    N, D, L = sf.arrays(runs)
    Dx = lr.effective_tokens(D, U)
    smallest = {b: min(r["n_weights"] for r in runs if r["budget"] == b) for b in {r["budget"] for r in runs}}
    keep = np.array([r["n_weights"] != smallest[r["budget"]] for r in runs])
    theta12, _ = sf.fit(N[keep], Dx[keep], L[keep])
    c12, c15 = sf.constants(theta12), sf.constants(np.array(run["fit"]["theta"]))
    assert c12["alpha"] > c15["alpha"] + 0.1 and c12["beta"] < c15["beta"] - 0.02
    plan = run["plan"]
    p12 = float(sf.predict(theta12, plan["n_weights"], lr.effective_tokens(plan["tokens"], U)))
    pred, val = run["predicted_nats_per_char"], run["val_nats_per_char"]
    assert abs(p12 - pred) < 0.01 and abs(val - p12) > abs(val - pred)


def test_33_3_the_law_as_if_new_was_further_off(recorded):
    _, run = recorded
    wr, plan = run["without_repetition"], run["plan"]
    assert wr["best"]["n_weights"] < plan["n_weights"] and wr["best"]["epochs"] > 2 * plan["epochs"]
    val, pred = run["val_nats_per_char"], run["predicted_nats_per_char"]
    assert wr["predicted"] < pred < val
