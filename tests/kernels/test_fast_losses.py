"""tformer.fast.losses equals tformer.kernels.losses (the chapter's equations), and its cross-entropy
shifted by the target's logit falls back to the row maximum where that shift overflows."""
import numpy as np
import pytest
from fast_equal_pointwise import TOL, assert_equal_to_kernel, threads  # noqa: F401

from tformer.nn import functional as F
from tformer.fast import losses as fast
from tformer.kernels import losses as kern


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(4, 10), (2, 5, 17), (8, 128, 100)])   # 1024 rows of 100: split
@pytest.mark.parametrize("ignore_index", [None, 3])
def test_fast_cross_entropy_equals_the_kernel(threads, dtype, shape, ignore_index):
    rng = np.random.default_rng(0)
    logits = (3 * rng.standard_normal(shape)).astype(dtype)
    logits[..., 0, 1] += 200                           # a logit far above the target's: the slow row path
    targets = rng.integers(0, shape[-1], shape[:-1])
    loss, dz = fast.cross_entropy(logits, targets, ignore_index)
    loss_k, dz_k = kern.cross_entropy(logits, targets, ignore_index)
    assert abs(loss - loss_k) <= TOL[dtype] * abs(loss_k)
    assert_equal_to_kernel(dz, dz_k, dtype)


def test_every_target_ignored_gives_zero_in_both():
    logits = np.random.default_rng(1).standard_normal((3, 4))
    targets = np.full(3, 2)
    for ce in (fast.cross_entropy, kern.cross_entropy):
        loss, dz = ce(logits, targets, ignore_index=2)
        assert loss == 0.0 and not dz.any()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("reduction", ["mean", "half_sum", "sum"])
def test_fast_mse_loss_equals_the_kernel(dtype, reduction):
    rng = np.random.default_rng(2)
    y, t = rng.standard_normal((2, 3, 4, 5)).astype(dtype)
    loss, dy = fast.mse_loss(y, t, reduction)
    loss_k, dy_k = kern.mse_loss(y, t, reduction)
    assert abs(loss - loss_k) <= TOL[dtype] * abs(loss_k)
    assert_equal_to_kernel(dy, dy_k, dtype)


def test_cross_entropy_falls_back_to_the_maximum_where_the_target_shift_overflows():
    """A logit 200 above the target's overflows e^{z − z_y} in float32: that block is done again
    shifted by the row maximum, and loss and gradient equal float64's; inf logits still raise."""
    rng = np.random.default_rng(3)
    z = rng.standard_normal((4, 6, 9)).astype(np.float32)
    t = rng.integers(0, 9, (4, 6))
    z[1, 2, (t[1, 2] + 1) % 9] = z[1, 2, t[1, 2]] + 200.0
    with np.errstate(over="raise", invalid="raise"):
        loss, dz = F.cross_entropy(z, t)
    want, dwant = F.cross_entropy(z.astype(np.float64), t)
    assert np.isfinite(loss) and loss == pytest.approx(want, rel=1e-6)
    np.testing.assert_allclose(dz, dwant, rtol=0, atol=1e-7)
    z[0, 0, 0] = np.inf
    with pytest.raises(FloatingPointError, match="inf or NaN"):
        F.cross_entropy(z, t)


# --- a sequence's log-probability (DPO, beam search, the decoding and preference measurements) ------

def _sequences(dtype, B=3, T=5, V=11, seed=4):
    rng = np.random.default_rng(seed)
    z = (3 * rng.standard_normal((B, T, V))).astype(dtype)
    y = rng.integers(0, V, (B, T))
    m = rng.random((B, T)) < 0.6
    m[:, 0] = True
    return z, y, m


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fast_log_softmax_is_the_kernel_to_the_bit(dtype):
    z, _, _ = _sequences(dtype)
    z[0, 0, 3] = 1e4                                      # a huge logit: finite, no overflow
    z[1, 2, 4] = -np.inf                                  # a token of probability 0
    logp, logp_k = fast.log_softmax(z), kern.log_softmax(z)
    assert np.array_equal(logp, logp_k)                   # tolerance 0: the same operations
    assert logp.dtype == np.dtype(dtype) and logp[1, 2, 4] == -np.inf and logp[0, 0, 3] == 0
    z[1, 2, 4] = 0
    assert_equal_to_kernel(fast.log_softmax(z), kern.log_softmax(z), dtype)
    assert np.abs(np.exp(logp.astype(np.float64)).sum(-1) - 1).max() <= 10 * TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sequence_logp_is_the_masked_sum_of_its_tokens_log_probabilities(dtype):
    z, y, m = _sequences(dtype)
    logp = fast.log_softmax(z)
    want = [sum(float(logp[b, t, y[b, t]]) for t in range(y.shape[1]) if m[b, t])
            for b in range(y.shape[0])]
    got = fast.sequence_logp(logp, y, m)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fast_sequence_logp_backward_equals_the_kernel_and_finite_differences(dtype):
    z, y, m = _sequences(dtype)
    g = np.random.default_rng(5).standard_normal(3).astype(dtype)
    logp = fast.log_softmax(z)
    d = fast.sequence_logp_backward(g, logp, y, m)
    assert_equal_to_kernel(d, kern.sequence_logp_backward(g, logp, y, m), dtype)
    out = np.full_like(z, np.nan)
    assert fast.sequence_logp_backward(g, logp, y, m, out=out) is out and np.array_equal(out, d)
    # ∂(Σ_b g_b log π(y_b))/∂z by central differences, in float64
    z64, g64, h = z.astype(np.float64), g.astype(np.float64), 1e-6
    f = lambda zz: float(g64 @ kern.sequence_logp(kern.log_softmax(zz), y, m))  # noqa: E731
    for idx in [(0, 0, y[0, 0]), (1, 2, 0), (2, 4, 7), (0, 1, y[0, 1])]:
        e = np.zeros_like(z64)
        e[idx] = h
        assert abs((f(z64 + e) - f(z64 - e)) / (2 * h) - float(d[idx])) <= 1e-6 + 10 * TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fast_token_logp_backward_equals_the_kernel_with_a_weight_per_token(dtype):
    z, y, m = _sequences(dtype)
    w = np.where(m, np.random.default_rng(6).standard_normal(m.shape), 0).astype(dtype)
    logp = fast.log_softmax(z)
    d = fast.token_logp_backward(w, logp, y)
    assert_equal_to_kernel(d, kern.token_logp_backward(w, logp, y), dtype)
    assert_equal_to_kernel(fast.token_logp(logp, y), np.take_along_axis(logp, y[..., None], -1)[..., 0],
                           dtype)
    assert not d[~m].any()                                # weight 0: no gradient


def test_softmax_minus_onehot_is_the_gradient_of_the_nll_in_both_losses():
    z, y, _ = _sequences(np.float64)
    logp = kern.log_softmax(z)
    d = kern.softmax_minus_onehot(logp, y)
    np.testing.assert_allclose(d.sum(-1), 0, atol=1e-12)          # Σ_v (p_v − onehot_v) = 1 − 1
    N = y.size
    assert_equal_to_kernel(kern.nll_backward(logp, y, np.ones(y.shape, bool)), d / N, np.float64)
    assert_equal_to_kernel(fast.cross_entropy(z, y)[1], d / N, np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_logistic_loss_is_minus_log_sigmoid_and_never_overflows(dtype):
    u = np.array([-1e4, -30, -2, -1e-3, 0, 0.5, 3, 30, 1e4], dtype=dtype)
    with np.errstate(over="raise", invalid="raise"):
        L, s = fast.logistic_loss(u)
    assert L.dtype == s.dtype == np.dtype(dtype) and np.isfinite(L).all()
    u64 = u.astype(np.float64)
    small = np.abs(u64) <= 30
    sig = 1 / (1 + np.exp(-u64[small]))
    np.testing.assert_allclose(L[small], -np.log(sig), rtol=10 * TOL[dtype], atol=TOL[dtype])
    np.testing.assert_allclose(s[small], 1 - sig, rtol=10 * TOL[dtype], atol=TOL[dtype])
    assert L[-1] == 0 and s[-1] == 0 and L[0] == 1e4 and s[0] == 1                  # the tails
    h = 1e-6                                                                       # dL/du = −σ(−u)
    dL = (fast.logistic_loss(u64 + h)[0] - fast.logistic_loss(u64 - h)[0]) / (2 * h)
    np.testing.assert_allclose(dL[small], -fast.logistic_loss(u64)[1][small], atol=1e-8)


def test_kl_divergence_is_zero_on_itself_and_positive_otherwise():
    z, _, _ = _sequences(np.float64)
    lp, lq = fast.log_softmax(z), fast.log_softmax(z[::-1])
    kl = fast.kl_divergence(lp, lq)
    want = (np.exp(lp) * (lp - lq)).sum(-1)
    np.testing.assert_allclose(kl, want, rtol=1e-12, atol=0)
    assert kl.shape == z.shape[:2] and (kl[0] > 0).all()   # rows 0 and 2 differ; row 1 is itself
    np.testing.assert_allclose(fast.kl_divergence(lp, lp), 0, atol=1e-15)


# --- GRPO's importance ratio and k3, best-of-n's KL of two yes/no distributions ------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_importance_ratio_per_token_and_per_response(dtype):
    z, y, m = _sequences(dtype)
    rng = np.random.default_rng(7)
    logp = np.where(m, fast.token_logp(fast.log_softmax(z), y), 0).astype(dtype)
    old = np.where(m, logp + 0.3 * rng.standard_normal(m.shape), 0).astype(dtype)
    rho = fast.importance_ratio(logp, old)
    assert rho.shape == m.shape and rho.dtype == np.dtype(dtype)
    np.testing.assert_allclose(rho, np.exp(logp.astype(np.float64) - old), rtol=10 * TOL[dtype])
    assert (rho[~m] == 1).all()                             # 0 − 0 off the mask
    seq = fast.importance_ratio(logp, old, m)                # GSPO: the mean log-ratio per response
    want = [np.exp(np.mean([float(logp[b, t]) - float(old[b, t]) for t in range(m.shape[1]) if m[b, t]]))
            for b in range(m.shape[0])]
    assert seq.shape == (m.shape[0], 1)
    np.testing.assert_allclose(seq[:, 0], want, rtol=10 * TOL[dtype])
    assert fast.importance_ratio is kern.importance_ratio    # nothing to make faster


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fast_k3_equals_the_kernel_and_is_exact_near_zero_where_the_kernel_is_not(dtype):
    rng = np.random.default_rng(8)
    logp = -rng.random(200).astype(dtype) * 5
    ref = (logp + rng.standard_normal(200) * 2).astype(dtype)
    (k, dk), (k_k, dk_k) = fast.k3(logp, ref), kern.k3(logp, ref)
    assert k.dtype == dk.dtype == np.dtype(dtype) and (k >= 0).all()
    scale = np.maximum(1, np.abs(ref - logp).astype(np.float64))         # e^u − u − 1 of numbers ~ |u|, e^u
    assert (np.abs(k - k_k) <= 10 * TOL[dtype] * np.maximum(scale, np.exp(ref - logp))).all()
    assert_equal_to_kernel(dk, dk_k, dtype)
    # ∂k3/∂log π by central differences (float64)
    l64, r64, h = logp.astype(np.float64), ref.astype(np.float64), 1e-6
    num = (fast.k3(l64 + h, r64)[0] - fast.k3(l64 - h, r64)[0]) / (2 * h)
    np.testing.assert_allclose(num, fast.k3(l64, r64)[1], rtol=1e-6, atol=1e-8)
    # near u = 0, k3 = u²/2 + u³/6 + u⁴/24 …: the derivative −(e^u − 1) is expm1's, exact to rounding,
    # where the kernel's 1 − e^u keeps ε/|u| relative; k3 = expm1(u) − u keeps ~ε/|u| relative,
    # the kernel's e^u − u − 1 only ε/u²
    u = np.array([1e-3, -1e-4, 3e-6, -1e-7], dtype)
    u64, eps = u.astype(np.float64), np.finfo(dtype).eps
    k_fast, dk_fast = fast.k3(np.zeros_like(u), u)
    k_kern, dk_kern = kern.k3(np.zeros_like(u), u)
    series = u64 ** 2 / 2 + u64 ** 3 / 6 + u64 ** 4 / 24 + u64 ** 5 / 120
    np.testing.assert_allclose(dk_fast, -(u64 + series), rtol=2 * eps)
    assert (np.abs(k_fast - series) <= 4 * eps / np.abs(u64) * series).all()
    assert (np.abs(k_kern - series) <= 4 * eps).all()                   # only absolutely
    rel = np.abs(k_kern - series) / series
    assert (rel[:2] > 10 * np.abs(k_fast - series)[:2] / series[:2]).all()      # |u| ≥ 1e-4


def test_bernoulli_kl_is_the_kl_of_two_yes_no_distributions():
    q = np.array([0.0, 1.0, 0.3, 0.9, 0.5, 0.0, 1.0])
    p = np.array([0.2, 0.7, 0.3, 0.5, 0.0, 0.0, 1.0])
    kl = fast.bernoulli_kl(q, p)
    want = [np.log(1 / 0.8), np.log(1 / 0.7), 0.0, 0.9 * np.log(0.9 / 0.5) + 0.1 * np.log(0.1 / 0.5),
            np.inf, 0.0, 0.0]
    np.testing.assert_allclose(kl, want, rtol=1e-14)
    z, _, _ = _sequences(np.float64)                           # the general KL on two outcomes
    lp = fast.log_softmax(np.stack([np.log(q[2:4]), np.log1p(-q[2:4])], -1))
    lq = fast.log_softmax(np.stack([np.log(p[2:4]), np.log1p(-p[2:4])], -1))
    np.testing.assert_allclose(kl[2:4], fast.kl_divergence(lp, lq), rtol=1e-12, atol=1e-15)
    # best-of-n with a yes/no judge: q = 1 − (1 − p)^n, below the bound log n − (n − 1)/n of a judge
    # that ranks every line, and 0 where every line or none says yes
    pp = np.array([1e-9, 1e-3, 0.1, 0.5, 1 - 1e-9])
    for n in (2, 4, 8):
        b = fast.bernoulli_kl(1 - (1 - pp) ** n, pp)
        assert (b < np.log(n) - (n - 1) / n).all() and b[0] < 1e-8 and b[-1] < 1e-8 and (b[1:4] > 0).all()
