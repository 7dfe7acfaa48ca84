"""The causal path's softmax, shifted by each query's own score s_ii instead of the row maximum:
the same probabilities, and a fallback to the maximum wherever the shift does not fit."""
import numpy as np
import pytest

from tformer import functional as F
from tformer.kernels.attention import causal_mask
from tformer.fast.softmax import _softmax_shifted_inplace


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-6), (np.float64, 1e-15)])
def test_any_shift_within_the_row_gives_the_softmax(dtype, tol):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 40)) * 8).astype(dtype)
    want, _ = F.softmax_forward(x)
    for col in (0, 17, 39):                              # any entry of the row as the shift
        got = x.copy()
        assert _softmax_shifted_inplace(got, x[:, col:col + 1].copy())
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_the_shift_reports_what_does_not_fit():
    x = np.zeros((3, 8), np.float32)
    x[1, 5] = 100.0                                      # e^{100 − 0} overflows float32
    assert not _softmax_shifted_inplace(x.copy(), np.zeros((3, 1), np.float32))
    y = np.zeros((2, 8), np.float32)
    y[0, 3] = np.nan
    assert not _softmax_shifted_inplace(y.copy(), np.zeros((2, 1), np.float32))
    z = np.zeros((2, 8), np.float32)
    z[1, 0] = np.inf
    assert not _softmax_shifted_inplace(z.copy(), np.zeros((2, 1), np.float32))
    w = np.zeros((2, 8), np.float32)                     # the shift itself is +inf: sums are 0
    assert not _softmax_shifted_inplace(w.copy(), np.full((2, 1), np.inf, np.float32))


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-13)])
@pytest.mark.parametrize("T", [5, 64, 150])
def test_causal_path_equals_the_masked_one(dtype, tol, T):
    """Shifting by s_ii instead of the maximum changes the exponents' arguments, so the last bits:
    scores of a few units (|s| up to about 10 here) agree to float rounding times |s|."""
    rng = np.random.default_rng(T)
    q, k, v = (rng.standard_normal((2, 3, T, 8)).astype(dtype) * 2 for _ in range(3))
    got, cache = F.attention_forward(q, k, v, is_causal=True)
    want, ref = F.attention_forward(q, k, v, mask=causal_mask(T))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(cache[3], ref[3], rtol=tol, atol=tol)


def test_a_score_far_above_the_own_one_falls_back_to_the_maximum():
    """Query 40 sees key 3 with a score 200 above its own (e^200 overflows float32, and
    float64 too once scaled up): the tile is recomputed with the row maximum, and the result is
    the masked path's, with no warning and no NaN."""
    T, D = 64, 4
    q = np.zeros((1, 1, T, D))
    k = np.zeros((1, 1, T, D))
    q[0, 0, 40, 0], k[0, 0, 3, 0] = 40.0, 10.0           # s = 400 / √D = 200 for (40, 3)
    for dtype in (np.float32, np.float64):
        qd, kd = q.astype(dtype), k.astype(dtype) * (1 if dtype == np.float32 else 8)
        v = np.random.default_rng(1).standard_normal((1, 1, T, D)).astype(dtype)
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            got, cache = F.attention_forward(qd, kd, v, is_causal=True)
        want, _ = F.attention_forward(qd, kd, v, mask=causal_mask(T))
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert cache[3][0, 0, 40, 3] == pytest.approx(1.0)


def test_nan_and_inf_in_the_scores_still_raise():
    T = 8
    q, k, v = (np.random.default_rng(2).standard_normal((1, 2, T, 4)).astype(np.float32)
               for _ in range(3))
    for bad in (np.nan, np.inf):
        kb = k.copy()
        kb[0, 1, 2, 0] = bad                             # seen by queries 2 … 7 of head 1
        with pytest.raises(ValueError, match="NaN or \\+inf"):
            F.attention_forward(q, kb, v, is_causal=True)


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
