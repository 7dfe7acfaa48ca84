"""The scaling-law fit (tformer.experiments.scaling_fit) on data drawn from known constants."""
import numpy as np
import pytest

from tformer.experiments import scaling_fit as S

C = S.CHINCHILLA
TRUE = np.array([np.log(C["A"]), np.log(C["B"]), np.log(C["E"]), C["alpha"], C["beta"]])


def isoflop_design(theta=TRUE, budgets=(1e18, 1e19, 1e20, 1e21), factors=(0.25, 0.5, 1, 2, 4)):
    """Five sizes around each budget's optimum, D = C / (6N): Chinchilla's design, in small."""
    N = np.array([S.compute_optimal(theta, c)[0] * f for c in budgets for f in factors])
    D = np.array([c / (6 * n) for c, n in zip(np.repeat(budgets, len(factors)), N)])
    return N, D, S.predict(theta, N, D)


def test_huber_is_quadratic_then_linear_and_its_slope_is_its_derivative():
    r = np.array([-1.0, -1e-3, -1e-4, 0.0, 5e-4, 1e-3, 0.2])
    value, slope = S.huber(r)
    assert np.allclose(value[np.abs(r) <= 1e-3], 0.5 * r[np.abs(r) <= 1e-3] ** 2, rtol=0, atol=1e-18)
    assert np.allclose(value[np.abs(r) > 1e-3], 1e-3 * (np.abs(r[np.abs(r) > 1e-3]) - 5e-4), rtol=1e-12)
    h = 1e-9
    numeric = (S.huber(r + h)[0] - S.huber(r - h)[0]) / (2 * h)
    assert np.allclose(numeric, slope, rtol=1e-5, atol=1e-9)


def test_gradient_matches_finite_differences():
    N, D, L = isoflop_design()
    logs = np.log(N), np.log(D), np.log(L) + np.random.default_rng(0).normal(0, 0.01, N.size)
    x = TRUE + np.array([0.3, -0.2, 0.1, 0.05, -0.03])
    _, g = S.objective(x, *logs)
    h = 1e-6
    numeric = np.array([(S.objective(x + e, *logs)[0] - S.objective(x - e, *logs)[0]) / (2 * h)
                        for e in np.eye(5) * h])
    assert np.allclose(numeric, g, rtol=1e-5, atol=1e-10)


def test_batch_objective_equals_one_at_a_time():
    N, D, L = isoflop_design()
    logs = np.log(N), np.log(D), np.log(L)
    thetas = S.grid()[::97]
    batch = S.objective_batch(thetas, *logs)
    assert np.allclose(batch, [S.objective(t, *logs)[0] for t in thetas], rtol=1e-12, atol=0)


def test_lbfgs_minimises_a_rosenbrock_valley():
    def rosenbrock(x):
        f = (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2
        g = np.array([-2 * (1 - x[0]) - 400 * x[0] * (x[1] - x[0] ** 2), 200 * (x[1] - x[0] ** 2)])
        return f, g
    x, f = S.lbfgs(rosenbrock, np.array([-1.2, 1.0]), max_iter=2000)
    assert np.allclose(x, [1.0, 1.0], atol=1e-6) and f < 1e-12


def test_exact_data_gives_back_the_constants():
    N, D, L = isoflop_design()
    theta, value = S.fit(N, D, L)
    got, want = S.constants(theta), S.constants(TRUE)
    for k in want:
        assert abs(got[k] - want[k]) <= 1e-6 * max(1.0, abs(want[k])), (k, got[k], want[k])
    assert value < 1e-20


def test_noisy_data_within_stated_tolerances_and_the_bootstrap_covers_the_truth():
    """0.5 % multiplicative noise on 20 runs: exponents within ±0.05, E within 5 %, and the
    95 % bootstrap interval of every constant holds the true one."""
    N, D, L = isoflop_design()
    L = L * np.exp(np.random.default_rng(1).normal(0, 0.005, L.size))
    theta, _ = S.fit(N, D, L)
    got = S.constants(theta)
    assert abs(got["alpha"] - C["alpha"]) < 0.05 and abs(got["beta"] - C["beta"]) < 0.05, got
    assert abs(got["E"] / C["E"] - 1) < 0.05, got
    lo, hi = S.interval(S.bootstrap(N, D, L, n_boot=40, seed=0))
    assert np.all(lo <= TRUE) and np.all(TRUE <= hi), (lo, TRUE, hi)


def test_compute_optimal_is_the_minimum_along_its_isoflop():
    for c in (1e15, 1e19, 1e23):
        n_opt, d_opt = S.compute_optimal(TRUE, c)
        assert abs(6 * n_opt * d_opt / c - 1) < 1e-12
        n = n_opt * np.exp(np.linspace(-1, 1, 2001))                 # (2001,) sizes around it
        best = n[np.argmin(S.predict(TRUE, n, c / (6 * n)))]
        assert abs(np.log(best / n_opt)) < 2e-3
    # N_opt ∝ C^(β/(α+β)), D_opt ∝ C^(α/(α+β)): with Chinchilla's constants 0.45 and 0.55, the
    # a = 0.46 and b = 0.54 of their Table 2 (approach 3), up to the rounding of α and β.
    (n1, d1), (n2, d2) = S.compute_optimal(TRUE, 1e19), S.compute_optimal(TRUE, 1e23)
    a, b = np.log(n2 / n1) / np.log(1e4), np.log(d2 / d1) / np.log(1e4)
    assert abs(a - C["beta"] / (C["alpha"] + C["beta"])) < 1e-12 and abs(a + b - 1) < 1e-12
    assert abs(a - 0.46) < 0.015 and abs(b - 0.54) < 0.015


def test_isoflop_parabola_finds_the_optimum_of_each_profile():
    """On exact data from the law, the parabola's vertex lies within 10 % of the true optimum
    (the law is not a parabola in ln N; sizes at 1/4..4× the optimum)."""
    N, D, L = isoflop_design()
    for k, c in enumerate((1e18, 1e19, 1e20, 1e21)):
        n_star, l_star = S.isoflop_minimum(N[5 * k:5 * k + 5], L[5 * k:5 * k + 5])
        n_opt = S.compute_optimal(TRUE, c)[0]
        assert abs(np.log(n_star / n_opt)) < 0.1, (c, n_star, n_opt)
        assert abs(l_star / S.predict(TRUE, n_opt, c / (6 * n_opt)) - 1) < 2e-3
    with pytest.raises(ValueError, match="no minimum"):
        S.isoflop_minimum([1e6, 2e6, 4e6], [3.0, 2.9, 2.5])


def test_arrays_and_predict_samples():
    runs = [dict(n_weights=1e6, tokens=2e7, val_nats_per_char=1.9)] * 5
    N, D, L = S.arrays(runs)
    assert N.shape == D.shape == L.shape == (5,) and L[0] == 1.9
    thetas = np.vstack([TRUE, TRUE + [0, 0, 0, 0.01, 0]])
    got = S.predict_samples(thetas, 1e9, 2e10)
    assert got.shape == (2,) and got[0] == S.predict(TRUE, 1e9, 2e10) and got[1] < got[0]


def test_bad_input_names_the_arguments():
    with pytest.raises(ValueError, match="N, D, L"):
        S.fit([1e6, 2e6], [1e9, 2e9], [3.0, 2.9])
