"""The worked solutions of the exercises of the Muon chapter (notebooks/36_muon.ipynb): every
number and formula a solution states, checked with SymPy, NumPy and the package."""
import numpy as np
import sympy as sp

from tformer.training.muon import NS_COEFFICIENTS, adjust_lr


def five_step_worst(coeffs, steps=5):
    s = np.linspace(0.05, 1.0, 200_001)
    for _ in range(steps):
        a, b, c = coeffs
        s = a * s + b * s**3 + c * s**5
    return np.abs(s - 1).max()


def test_36_1_the_quintic_fixed_point_in_the_band_repels():
    x = sp.Symbol("x", real=True)
    a, b, c = (sp.nsimplify(v) for v in NS_COEFFICIENTS)
    p = a * x + b * x**3 + c * x**5
    assert abs(float(a + b + c) - 0.7010) < 1e-12                  # p(1) ≠ 1
    y = sp.Symbol("y", positive=True)                               # p(σ) = σ: quadratic in σ²
    roots = sp.solve(sp.expand((p / x - 1).subs(x, sp.sqrt(y))), y)
    assert len(roots) == 2 and all(r > 0 for r in roots)
    star = sp.sqrt(min(roots))
    assert sp.simplify(p.subs(x, star) - star) == 0
    assert float(sp.diff(p, x).subs(x, star)) < -1                  # repelling
    assert 0.6 < float(star) < 1.0


def test_36_2_the_cubic_needs_more_than_five_steps_from_0_05():
    worst = five_step_worst(NS_COEFFICIENTS)
    s, n = 0.05, 0
    while abs(s - 1) > worst:
        s, n = 1.5 * s - 0.5 * s**3, n + 1
    assert n > 5 and abs(s - 1) <= worst
    assert five_step_worst((1.5, -0.5, 0.0)) > worst               # five cubic steps: worse


def test_36_3_update_rms_of_the_mlp_matrices():
    C = 128
    rng = np.random.default_rng(0)
    for shape, orig in (((C, 4 * C), 1 / np.sqrt(C)), ((4 * C, C), 1 / (2 * np.sqrt(C)))):
        U, _, Vt = np.linalg.svd(rng.standard_normal(shape), full_matrices=False)
        rms = np.sqrt(np.mean((U @ Vt) ** 2))
        assert abs(rms - 1 / np.sqrt(4 * C)) < 1e-12
        assert abs(adjust_lr(1.0, "original", shape) * rms - orig) < 1e-12
        assert abs(adjust_lr(1.0, "match_rms_adamw", shape) * rms - 0.2) < 1e-12


def test_36_4_muon_pays_when_it_saves_more_steps_than_a_step_costs():
    import json
    from pathlib import Path
    sr = json.loads((Path(__file__).resolve().parents[2] / "book/data/speedrun.json").read_text())
    breakeven = sr["tau"]["recipe"]["median"] / sr["tau"]["muon"]["median"]
    muon = next(e for e in sr["table"] if e["name"] == "muon")
    used = np.mean(muon["reached"]) / sr["base_steps"]
    assert 0 < used < breakeven < 1
    # the time of a stage is its steps times its τ: lower exactly when used < breakeven
    assert np.isclose(muon["time"][0] / (sr["base_steps"] * sr["tau"]["recipe"]["median"]),
                      used / breakeven, rtol=1e-12)


def test_36_5_newton_schulz_costs_two_thirds_of_a_recipe_step():
    m, n = sp.symbols("m n", positive=True)
    # XXᵀ (m×n times n×m), A² (m×m times m×m), BX (m×m times m×n): 2 flops per multiply-add
    per_step = 2 * m * n * m + 2 * m * m * m + 2 * m * m * n
    assert sp.expand(per_step - (4 * m**2 * n + 2 * m**3)) == 0
    f = lambda a, b: 4 * a * a * b + 2 * a**3  # noqa: E731
    ns = 4 * 5 * (f(128, 384) + f(128, 128) + 2 * f(128, 512))
    N = 4 * (128 * 384 + 128 * 128 + 2 * 128 * 512)
    share = ns / (6 * N * 12 * 64)
    assert abs(share - 2 / 3) < 0.05 and abs(ns / 1e9 - 2.3488) < 1e-4
