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
