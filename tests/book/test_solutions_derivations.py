"""The worked solutions of the first part's exercises (issue 42): every number or formula that a
solution under an exercise of the chapters A language model on one page, Softmax, Linear layers,
Activations, LayerNorm, Scaled dot-product attention, Losses and Optimizers states is checked here
(SymPy for a derivation, NumPy for a number), one test per solution, named by chapter and exercise.
The solutions already checked in ``tests/book/test_solutions.py`` are not repeated."""
import math

import mpmath
import numpy as np
import pytest
import sympy as sp

import tformer.nn.functional as F
from tformer.kernels.attention import attention_backward, attention_forward
from tformer.kernels.layernorm import layernorm_backward, layernorm_forward
from tformer.kernels.linear import linear_backward, linear_forward
from tformer.nn.layers import Linear
from tformer.models import OneHeadLM
from tformer.training.optim import Adam


# ---------------------------------------------------------------- A language model on one page


def test_one_page_ex1_without_the_residual_position_0_is_its_own_value():
    """H = Y: row 0 of the causal attention is [1, 0, …], so H_0 = V_0 = X_0 W_v exactly, and
    position t keeps its own byte only with the weight A_tt < 1 that it does not spend on others."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 1, 6, 4))
    y, cache = attention_forward(q, k, v, mask=F.causal_mask(6))
    assert np.array_equal(cache.P[0, 0], np.eye(6)[0])
    assert np.array_equal(y[0, 0], v[0, 0])
    diag = np.diagonal(cache.P[0])[1:]
    assert np.all(diag < 1) and np.all(diag > 0)
    # the output is the average: the own value's share is exactly A_tt
    t = 4
    others = cache.P[0, t, :t] @ v[0, :t]
    assert np.allclose(y[0, t], cache.P[0, t, t] * v[0, t] + others, rtol=1e-12)


def test_one_page_ex2_without_positions_the_head_sees_a_set():
    """W_pe = 0: the last position's logits do not change when the earlier bytes are permuted,
    so no distance can be preferred, not even distance 0 over an earlier copy of the same byte."""
    model = OneHeadLM(d_model=8, max_len=6, vocab_size=11, seed=1, dtype=np.float64)
    for _, param, _ in model.named_parameters():
        param *= 50                                           # std 1: scores of size one
    tokens = np.array([[3, 7, 1, 9, 4, 2]])
    shuffled = tokens[:, [2, 0, 4, 1, 3, 5]]                 # the last byte stays in place
    with_pos = model.forward(tokens)[0, -1], model.forward(shuffled)[0, -1]
    assert np.abs(with_pos[0] - with_pos[1]).max() > 1e-3    # positions make order visible
    model.wpe.W[...] = 0.0
    a, b = model.forward(tokens)[0, -1], model.forward(shuffled)[0, -1]
    assert np.allclose(a, b, rtol=0, atol=1e-12)
    # a repeated byte gets the same score at every distance
    model.forward(np.array([[5, 5, 5, 5]]))
    assert np.allclose(model.att[0, 3, :4], 0.25, rtol=0, atol=1e-12)


def _distinct_4grams(seq):
    grams = [tuple(seq[i:i + 4]) for i in range(len(seq) - 3)]
    return len(set(grams)) / len(grams)


def test_one_page_ex3_low_temperature_repeats_itself():
    """A short training of the one-page model, then 300 bytes at τ = 0.3 and τ = 1.5: the cold
    sample repeats its 4-byte pieces (about half are repeats) and stays in ASCII; the hot one
    repeats almost none and draws bytes the text never has. The mean entropy of softmax(z/τ) grows with τ."""
    from tformer.data.shakespeare import shakespeare_data
    from tformer.data.text import encode
    from tformer.decoding.generate import sample
    from tformer.training.optim import AdamW

    data = shakespeare_data(32, 16, seed=0)
    model = OneHeadLM(d_model=32, max_len=32, seed=0)
    opt = AdamW(model, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01)
    for step in range(200):
        x, y = data.batch(step)
        _, dlogits = F.cross_entropy(model.forward(x), y)
        model.zero_grad()
        model.backward(dlogits)
        opt.step()
    prompt = encode("HAMLET:\n")[None].astype(np.int64)
    cold = sample(model, prompt, 300, temperature=0.3, seed=0)[0, 8:].tolist()
    hot = sample(model, prompt, 300, temperature=1.5, seed=0)[0, 8:].tolist()
    assert _distinct_4grams(cold) < 0.75 < _distinct_4grams(hot)
    assert max(cold) < 128 <= max(hot)
    # the mechanism: softmax(z/τ) is sharper below τ = 1
    z = model.forward(data.batch(999)[0])[:, -1].astype(np.float64)
    entropy = {}
    for tau in (0.3, 1.0, 1.5):
        p, _ = F.softmax_forward(z / tau)
        entropy[tau] = -(p * np.log(np.maximum(p, 1e-300))).sum(axis=-1).mean()
    assert entropy[0.3] < entropy[1.0] < entropy[1.5]


# ------------------------------------------------------------------------------------ Softmax


def test_softmax_ex2_temperature_jacobian():
    """J_τ = (diag(s) − s sᵀ)/τ with s = softmax(x/τ); J → 0 as τ → 0 (s one-hot) and
    τ J → (I/n − 11ᵀ/n²) as τ → ∞ (s uniform), so J → 0 like 1/τ there too."""
    n = 3
    x = sp.Matrix(sp.symbols("x1:4", real=True))
    tau = sp.Symbol("tau", positive=True)
    e = x.applyfunc(lambda v: sp.exp(v / tau))
    s = e / sum(e)
    J = s.jacobian(x)
    claimed = (sp.diag(*s) - s * s.T) / tau
    assert all(sp.simplify(a - b) == 0 for a, b in zip(J, claimed))
    fJ = sp.lambdify([tau, *x], J, "mpmath")
    mpmath.mp.dps = 50
    cold = np.array(fJ(mpmath.mpf("0.01"), 1, 2, 3).tolist(), dtype=float)
    assert np.abs(cold).max() < 1e-30
    big = 1e6
    hot = np.array(fJ(mpmath.mpf(big), 1, 2, 3).tolist(), dtype=float) * big
    assert np.allclose(hot, np.eye(n) / n - np.ones((n, n)) / n**2, atol=1e-5)


# ------------------------------------------------------------------------------ Linear layers


def test_linear_ex1_pytorch_layout():
    """Y = X Wᵀ with W: (d_out, d_in): dX = dY W, dW = dYᵀ X; the transpose is of dY now."""
    X = sp.Matrix(2, 3, lambda i, j: sp.Symbol(f"x{i}{j}"))
    W = sp.Matrix(4, 3, lambda i, j: sp.Symbol(f"w{i}{j}"))
    G = sp.Matrix(2, 4, lambda i, j: sp.Symbol(f"g{i}{j}"))
    L = sum(G.multiply_elementwise(X * W.T))
    dX = X.applyfunc(lambda v: sp.diff(L, v))
    dW = W.applyfunc(lambda v: sp.diff(L, v))
    assert (dX - G * W).expand() == sp.zeros(2, 3)
    assert (dW - G.T * X).expand() == sp.zeros(4, 3)


def test_linear_ex2_fused_qkv_gradient_is_three_side_by_side():
    rng = np.random.default_rng(0)
    B, T, C = 2, 5, 4
    x = rng.standard_normal((B, T, C))
    Wq, Wk, Wv = rng.standard_normal((3, C, C))
    bq, bk, bv = rng.standard_normal((3, C))
    g = rng.standard_normal((B, T, 3 * C))
    W = np.concatenate([Wq, Wk, Wv], axis=1)                  # (C, 3C)
    b = np.concatenate([bq, bk, bv])
    _, cache = linear_forward(x, W, b)
    dx, dW, db = linear_backward(g, cache)
    parts = []
    dx_sum = np.zeros_like(x)
    for i, (Wi, bi) in enumerate(((Wq, bq), (Wk, bk), (Wv, bv))):
        _, c = linear_forward(x, Wi, bi)
        dxi, dWi, dbi = linear_backward(g[..., i * C:(i + 1) * C], c)
        parts.append((dWi, dbi))
        dx_sum += dxi
    assert np.allclose(dW, np.concatenate([p[0] for p in parts], axis=1), rtol=1e-12)
    assert np.allclose(db, np.concatenate([p[1] for p in parts]), rtol=1e-12)
    assert np.allclose(dx, dx_sum, rtol=1e-12)


def test_linear_ex3_einsum_and_the_gemm_agree():
    """np.einsum computes the same dW with or without its optimizer (the optimizer's path hands a
    two-operand contraction to tensordot, which calls BLAS; without it einsum runs its own loops)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16, 32))
    dy = rng.standard_normal((8, 16, 48))
    ref = x.reshape(-1, 32).T @ dy.reshape(-1, 48)
    assert np.allclose(np.einsum("btc,btd->cd", x, dy), ref, rtol=1e-12, atol=1e-12)
    assert np.allclose(np.einsum("btc,btd->cd", x, dy, optimize=True), ref,
                       rtol=1e-12, atol=1e-12)
    import inspect

    import numpy._core.einsumfunc as einsumfunc
    assert "tensordot(" in inspect.getsource(einsumfunc.einsum)


# -------------------------------------------------------------------------------- Activations


def test_activations_ex2_stable_sigmoid():
    """σ(x) = 1/(1 + e^{−x}) for x ≥ 0, e^{x}/(1 + e^{x}) for x < 0: only e^{−|x|} ≤ 1 is evaluated,
    no overflow even at ±1000, relative error below 4 ulps (4·2⁻⁵³) on [−700, 700] against
    40-digit values.
    y(1 − y) loses everything for x ≫ 0 (y rounds to 1); σ(x)·σ(−x) keeps it."""
    xs = np.linspace(-700, 700, 2801)
    with np.errstate(over="raise", under="ignore"):
        e = np.exp(-np.abs(xs))
        stable = np.where(xs >= 0, 1 / (1 + e), e / (1 + e))
        big = np.exp(-np.abs(np.array([-1000.0, 1000.0])))     # underflows to 0, no overflow
    assert np.all(big == 0)
    mpmath.mp.dps = 40
    ref = np.array([float(1 / (1 + mpmath.exp(-mpmath.mpf(float(v))))) for v in xs])
    nz = ref > 0
    rel = np.abs(stable[nz] - ref[nz]) / ref[nz]
    assert rel.max() < 4 * 2.0**-53
    x = 40.0
    y, _ = F.sigmoid_forward(np.array([x]))
    naive = y[0] * (1 - y[0])                                 # sigmoid_backward's y(1 − y)
    exact = float(mpmath.exp(-x) / (1 + mpmath.exp(-x)) ** 2)
    assert naive == 0.0
    s_pos, s_neg = 1 / (1 + math.exp(-x)), math.exp(-x) / (1 + math.exp(-x))
    assert abs(s_pos * s_neg - exact) / exact < 1e-15


# --------------------------------------------------------------------------------- LayerNorm


def test_layernorm_ex2_the_term_that_is_zero():
    """Σ_j (x_j − μ) = 0 in exact arithmetic; in float32 at μ = 1000, σ = 1 it is a rounding
    residue of the size of an ulp of 1000 (6.1e-5) times a few, not 0: dropping it loses nothing."""
    n = 5
    xs = sp.symbols("x1:6", real=True)
    mu = sum(xs) / n
    assert sp.simplify(sum(x - mu for x in xs)) == 0
    rng = np.random.default_rng(0)
    row = (1000 + rng.standard_normal(768)).astype(np.float32)
    mu32 = row.mean(dtype=np.float32)
    residue = float(np.sum(row - mu32, dtype=np.float32) / row.size)
    exact = float(np.sum(row.astype(np.float64) - row.astype(np.float64).mean()))
    assert abs(exact) < 1e-9
    ulp = float(np.spacing(np.float32(1000)))
    assert 0 < abs(residue) < 16 * ulp


def test_layernorm_ex3_caching_xhat():
    """Caching x̂ gives the same dx; its extra memory in TinyGPT's chapter configuration
    (B = 32, T = 64, C = 64, 2 blocks: 2·2 + 1 = 5 LayerNorms, float32) is 5·B·T·C·4 bytes
    = 2,621,440 bytes = 2.5 MiB per training step."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 16))
    gamma, beta = rng.standard_normal((2, 16))
    dy = rng.standard_normal(x.shape)
    _, cache = layernorm_forward(x, gamma, beta)
    dx, _, _ = layernorm_backward(dy, cache)
    xhat = (x - cache.mu) * cache.rstd                        # the cached variant
    g = gamma * dy
    dx_cached = cache.rstd * (g - g.mean(-1, keepdims=True)
                              - xhat * (g * xhat).mean(-1, keepdims=True))
    assert np.allclose(dx, dx_cached, rtol=1e-12, atol=1e-12)
    B, T, C, n_ln = 32, 64, 64, 2 * 2 + 1
    assert n_ln * B * T * C * 4 == 2_621_440 == int(2.5 * 2**20)


# ------------------------------------------------------------------ Scaled dot-product attention


def test_attention_ex1_gradient_of_the_scale():
    """∂L/∂s = ⟨dS, Q Kᵀ⟩ for T = D = 2 in SymPy; attention at scale s = attention at scale 1
    on s Q (so a learned temperature is already W_q's)."""
    s = sp.Symbol("s", positive=True)
    Q, K, V, G = (sp.Matrix(2, 2, lambda i, j, n=n: sp.Symbol(f"{n}{i}{j}")) for n in "qkvg")
    S = s * Q * K.T
    E = S.applyfunc(sp.exp)
    P = sp.Matrix(2, 2, lambda i, j: E[i, j] / sum(E.row(i)))
    L = sum(G.multiply_elementwise(P * V))
    dP = G * V.T
    rowsum = (dP.multiply_elementwise(P) * sp.ones(2, 1)) * sp.ones(1, 2)
    dS = P.multiply_elementwise(dP - rowsum)
    claimed = sum(dS.multiply_elementwise(Q * K.T))
    diff = sp.diff(L, s) - claimed
    assert sp.expand(sp.together(diff).as_numer_denom()[0]) == 0
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 2, 3, 5, 4))
    for scale in (0.3, 1.7):
        y1, _ = attention_forward(q, k, v, scale=scale)
        y2, _ = attention_forward(scale * q, k, v, scale=1.0)
        assert np.allclose(y1, y2, rtol=1e-12, atol=1e-14)


def test_attention_ex2_padding_queries():
    rng = np.random.default_rng(1)
    tokens = np.array([[7, 3, 9, 0, 0]])
    pad = tokens[0] == 0
    q, k, v = rng.standard_normal((3, 1, 2, 5, 4))
    g = rng.standard_normal((1, 2, 5, 4))
    y, cache = attention_forward(q, k, v, mask=F.padding_mask(tokens))
    dq, dk, dv = attention_backward(g, cache)
    assert np.abs(y[0, :, pad]).min() > 0                     # padding queries have outputs
    assert np.abs(dq[0, :, pad]).max() > 1e-3                 # and gradients
    # ignore_index gives dY = 0 at padding positions: then dQ = 0 there, exactly
    logits = rng.standard_normal((1, 5, 11))
    _, dlogits = F.cross_entropy(logits, tokens, ignore_index=0)
    assert np.all(dlogits[0, pad] == 0)
    g_ignored = np.where(pad[None, None, :, None], 0.0, g)
    dq0, dk0, dv0 = attention_backward(g_ignored, cache)
    assert np.all(dq0[0, :, pad] == 0)


def test_attention_ex3_float32_fill_near_the_minimum():
    """−3e38 + s overflows for s below about −4.03e37 (the halfway point 2¹²⁸ − 2¹⁰³); scores of
    1e32 keep the row finite and one-hot on the largest; an all −∞ row gets zeros."""
    f32 = np.float32
    fill = f32(-3e38)
    threshold = 2.0**128 - 2.0**103 + float(fill)             # ≈ 4.03e37
    assert abs(threshold - 4.03e37) < 0.01e37
    with np.errstate(over="ignore"):
        assert np.isfinite(fill + f32(-0.99 * threshold))
        assert np.isneginf(fill + f32(-1.01 * threshold))
        row = fill + np.array([1e32, -1e32, 0.0], dtype=f32)
        blown = fill + np.full(3, -1e38, dtype=f32)
    assert np.all(np.isfinite(row)) and len(set(row.tolist())) == 3
    p, _ = F.softmax_forward(row[None])
    assert np.array_equal(p[0], [1.0, 0.0, 0.0])
    assert np.all(np.isneginf(blown))
    p0, _ = F.softmax_forward(blown[None])
    assert np.all(p0 == 0)


# ------------------------------------------------------------------------------------ Losses


def test_losses_ex2_without_ignore_index_the_real_tokens_get_half():
    rng = np.random.default_rng(0)
    B, T, V, PAD = 2, 6, 7, 0
    logits = rng.standard_normal((B, T, V))
    targets = rng.integers(1, V, (B, T))
    targets[:, T // 2:] = PAD                                 # half padding
    real = targets != PAD
    _, d_ignore = F.cross_entropy(logits, targets, ignore_index=PAD)
    _, d_all = F.cross_entropy(logits, targets)
    assert np.allclose(d_all[real], d_ignore[real] / 2, rtol=1e-12)
    assert np.all(d_ignore[~real] == 0) and np.abs(d_all[~real]).max() > 0


# -------------------------------------------------------------------------------- Optimizers


def test_optimizers_ex1_drifting_mean():
    """E[g_i] = μ + δ i: the bias-corrected m̂_t estimates μ + δ (t − β/(1−β) + t β^t/(1−β^t)),
    the mean of a gradient β/(1−β) steps old for large t (9 steps for β = 0.9)."""
    mu, delta, b = sp.symbols("mu delta beta", positive=True)
    t = sp.Symbol("t", integer=True, positive=True)
    i = sp.Symbol("i", integer=True, positive=True)
    m = (1 - b) * sp.summation(b ** (t - i) * (mu + delta * i), (i, 1, t))
    m_hat = m / (1 - b**t)
    claimed = mu + delta * (t - b / (1 - b) + t * b**t / (1 - b**t))
    for tv in (1, 2, 5, 13):
        for bv in (sp.Rational(9, 10), sp.Rational(1, 3)):
            assert sp.simplify((m_hat - claimed).subs({t: tv, b: bv})) == 0
    lag = sp.limit((mu + delta * t - claimed.subs(b, sp.Rational(9, 10))) / delta, t, sp.oo)
    assert lag == 9


def test_optimizers_ex3_l2_inside_adam():
    """Adam on the gradient plus λθ converges to the minimum of the regularised loss,
    θ*_j = h_j/(h_j + λ): coordinates with h_j ≪ λ go to zero. The decoupled decay of AdamW
    leaves them near 1 (within 2e-2 for h ≥ 1e-8 in the chapter)."""
    h = 10.0 ** -np.arange(0, 12, 2)
    X = np.diag(np.sqrt(h))
    Y = X @ np.ones((6, 1))
    lam = 1e-3
    model = Linear(6, 1, bias=False, dtype=np.float64)
    model.W[...] = 0.0
    opt = Adam(model, lr=0.01)
    for _ in range(3000):
        _, dy = F.mse_loss(model.forward(X), Y, reduction="half_sum")
        model.zero_grad()
        model.backward(dy)
        model.grads["W"] += lam * model.W
        opt.step()
    target = h / (h + lam)
    assert np.abs(model.W[:, 0] - target).max() < 0.02
    assert np.all(model.W[2:, 0] < 0.1)                        # h ≤ 1e-4: pulled to ≈ 0
