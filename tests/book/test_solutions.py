"""The worked solutions of the chapters' exercises: every number and formula they state, checked.

Each test names its chapter and exercise; the solution's text (a collapsed block under the
exercises) states what is asserted here. Derivations are checked with SymPy, numbers with the code.
"""
import numpy as np
import pytest
import sympy as sp

import tformer.nn.functional as F


def _softmax(xs):
    e = [sp.exp(x) for x in xs]
    return [v / sum(e) for v in e]


# --- chapter 01, softmax ---------------------------------------------------------------------
def test_01_1_jacobian_is_singular_with_the_ones_vector_in_its_null_space():
    xs = sp.symbols("x1:4", real=True)
    s = sp.Matrix(_softmax(xs))
    J = s.jacobian(xs)
    assert sp.simplify(J * sp.ones(3, 1)) == sp.zeros(3, 1)      # a null vector: J is singular
    assert sp.simplify(J - J.T) == sp.zeros(3, 3)                # symmetric: 1ᵀJ = 0 too
    # so every input gradient sums to zero: the inputs' common offset never moves
    rng = np.random.default_rng(0)
    y, cache = F.softmax_forward(rng.standard_normal((3, 7)))
    dx = F.softmax_backward(rng.standard_normal((3, 7)), cache)
    assert np.abs(dx.sum(axis=-1)).max() < 1e-6
    shifted, _ = F.softmax_forward(rng.standard_normal((3, 7)) * 0 + 5.0)
    assert np.allclose(shifted, 1 / 7)


def test_01_3_log_softmax_vjp_is_g_minus_s_times_sum_g():
    xs = sp.symbols("x1:4", real=True)
    gs = sp.symbols("g1:4", real=True)
    logsum = sp.log(sum(sp.exp(x) for x in xs))
    y = [x - logsum for x in xs]                                  # the max cancels exactly
    s = _softmax(xs)
    for j, xj in enumerate(xs):
        vjp = sum(g * sp.diff(yi, xj) for g, yi in zip(gs, y))
        assert sp.simplify(vjp - (gs[j] - s[j] * sum(gs))) == 0
        assert sp.simplify(s[j] - sp.exp(y[j])) == 0              # s = exp(y): no division


# --- chapter 03, activations -----------------------------------------------------------------
def test_03_1_sigmoid_derivative_through_tanh():
    x = sp.Symbol("x", real=True)
    assert sp.simplify(sp.diff(sp.tanh(x), x) - (1 - sp.tanh(x) ** 2)) == 0
    sigma = (1 + sp.tanh(x / 2)) / 2
    assert sp.simplify((sigma - 1 / (1 + sp.exp(-x))).rewrite(sp.exp)) == 0
    assert sp.simplify((sp.diff(sigma, x) - sigma * (1 - sigma)).rewrite(sp.exp)) == 0
    # without exponentials: with t = tanh(x/2), dσ/dx = (1/2)(1 − t²)(1/2) = ((1 + t)/2)((1 − t)/2)
    t = sp.Symbol("t")
    assert sp.expand((1 - t ** 2) / 4 - (1 + t) / 2 * (1 - (1 + t) / 2)) == 0


def test_03_3_swish_has_the_deeper_minimum():
    h = sp.Symbol("h", real=True)
    swish = h / (1 + sp.exp(-h))
    h_star = sp.nsolve(sp.diff(swish, h), h, -1.3)
    gelu = h * (1 + sp.erf(h / sp.sqrt(2))) / 2
    g_star = sp.nsolve(sp.diff(gelu, h), h, -0.75)
    assert abs(h_star + 1.27846) < 1e-5 and abs(swish.subs(h, h_star) + 0.27846) < 1e-5
    assert abs(swish.subs(h, h_star) - (h_star + 1)) < 1e-12     # at the minimum, h·σ(h) = h + 1
    assert abs(g_star + 0.75179) < 1e-5 and abs(gelu.subs(h, g_star) + 0.16997) < 1e-5


# --- chapter 04, LayerNorm -------------------------------------------------------------------
def test_04_1_rmsnorm_backward_drops_the_mean_term():
    n = 3
    xs = sp.symbols(f"x1:{n + 1}", real=True)
    gam = sp.symbols(f"gamma1:{n + 1}", real=True)
    dy = sp.symbols(f"dy1:{n + 1}", real=True)
    eps = sp.Symbol("epsilon", positive=True)
    r = 1 / sp.sqrt(sum(x ** 2 for x in xs) / n + eps)
    y = [g * x * r for g, x in zip(gam, xs)]
    L = sum(d * yi for d, yi in zip(dy, y))
    g = [ga * d for ga, d in zip(gam, dy)]
    xhat = [x * r for x in xs]
    mean_gx = sum(gi * xh for gi, xh in zip(g, xhat)) / n
    for j in range(n):
        assert sp.simplify(sp.diff(L, xs[j]) - r * (g[j] - xhat[j] * mean_gx)) == 0


# --- chapter 06, losses ----------------------------------------------------------------------
def test_06_1_label_smoothing_gradient_is_p_minus_target():
    V = 4
    z = sp.symbols(f"z1:{V + 1}", real=True)
    eps = sp.Symbol("varepsilon", positive=True)
    y = 2                                                         # the true class
    target = [(1 - eps) * int(i == y) + eps / V for i in range(V)]
    p = _softmax(z)
    L = -sum(t * sp.log(pi) for t, pi in zip(target, p))
    for j in range(V):
        assert sp.simplify(sp.diff(L, z[j]) - (p[j] - target[j])) == 0


def test_06_3_half_sum_is_mean_times_BTd_over_2():
    B, T, d, mse = 16, 8, 64, 0.0043
    assert abs(mse * B * T * d / 2 - 17.6128) < 1e-9
    rng = np.random.default_rng(0)
    pred, target = rng.standard_normal((2, B, T, d))
    mean, _ = F.mse_loss(pred, target, reduction="mean")
    half, _ = F.mse_loss(pred, target, reduction="half_sum")
    assert abs(half / mean - B * T * d / 2) < 1e-9 * B * T * d


# --- chapter 07, optimizers ------------------------------------------------------------------
def test_07_2_outside_epsilon_with_the_same_half_step():
    g, eps, eps_out = sp.symbols("g epsilon epsilon_out", positive=True)
    half_000 = sp.solve(sp.Eq(g / sp.sqrt(g ** 2 + eps), sp.Rational(1, 2)), g)[0]
    assert half_000 == sp.sqrt(eps / 3)
    sol = sp.solve(sp.Eq(half_000 / (half_000 + eps_out), sp.Rational(1, 2)), eps_out)
    assert sol == [sp.sqrt(eps / 3)]
    assert abs(float(sol[0].subs(eps, 1e-8)) - 5.7735e-5) < 1e-9


# --- chapter 12, TinyGPT ---------------------------------------------------------------------
def test_14_1_tying_saves_V_times_C():
    from tformer.models import TinyGPT
    untied = TinyGPT(d_model=64, n_layers=2, max_len=16)
    tied = TinyGPT(d_model=64, n_layers=2, max_len=16, tie_embeddings=True)
    assert untied.num_parameters() - tied.num_parameters() == 256 * 64 == 16_384


# --- chapter 17, fewer bits ------------------------------------------------------------------
def test_22_4_mlp_product_passes_the_exact_float32_limit_at_C_261():
    assert 1040 * 127 ** 2 <= 2 ** 24 < 1041 * 127 ** 2
    C = next(c for c in range(1, 10_000) if 4 * c * 127 ** 2 > 2 ** 24)
    assert C == 261 and 4 * 256 <= 1040
    # past the bound a partial sum can exceed 2^24 with an odd value, which float32 rounds:
    # at K = 4·261 = 1044 the partial sum of 1041 terms of 127² is odd and above 2^24
    assert 1041 * 127 ** 2 > 2 ** 24 and (1041 * 127 ** 2) % 2 == 1
    assert float(np.float32(1041 * 127 ** 2)) != 1041 * 127 ** 2


# --- chapter 20, modern block ----------------------------------------------------------------
def test_25_5_tied_row_of_an_unseen_token_still_gets_a_gradient():
    from tformer.models import TinyGPT
    model = TinyGPT(d_model=16, n_layers=1, max_len=8, tie_embeddings=True, dtype=np.float64)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 100, (2, 8))                        # bytes 100..255 never occur
    targets = rng.integers(0, 100, (2, 8))
    model.zero_grad()
    loss, dlogits = F.cross_entropy(model.forward(tokens), targets)
    model.backward(dlogits)
    grad = dict((n, g) for n, _, g in model.named_parameters())["wte.W"]
    unseen = 200
    assert np.abs(grad[unseen]).max() > 1e-6                      # p > 0 pushes its logit down
    # and it is the head's part alone: a central difference on one entry agrees
    W = model.wte.W
    h = 1e-6
    old = W[unseen, 3]
    W[unseen, 3] = old + h
    up, _ = F.cross_entropy(model.forward(tokens), targets)
    W[unseen, 3] = old - h
    down, _ = F.cross_entropy(model.forward(tokens), targets)
    W[unseen, 3] = old
    assert abs((up - down) / (2 * h) - grad[unseen, 3]) < 1e-7


@pytest.mark.parametrize("chapter", ["01", "03", "04", "06", "07", "14", "22", "25"])
def test_each_solved_chapter_has_collapsed_solutions(chapter):
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    path = next((root / "notebooks").glob(f"{chapter}_*.ipynb"))
    text = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                   if c["cell_type"] == "markdown")
    assert "Solution to exercise" in text and ":class: dropdown" in text
