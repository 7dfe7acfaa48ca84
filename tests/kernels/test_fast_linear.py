"""tformer.fast.linear equals tformer.kernels.linear (the chapter's equations): float64 to ~1e-12,
float32 to ~1e-5, with one thread and with two (the threaded sizes), with out= and accumulate=."""
import numpy as np
import pytest
from fast_equal_pointwise import assert_equal_to_kernel, threads  # noqa: F401

from tformer.core.dtypes import bfloat16
from tformer.fast import linear as fast
from tformer.kernels import linear as ref

SHAPES = [((5, 3), 3, 4), ((2, 7, 6), 6, 5), ((4, 64, 96), 96, 128), ((512, 64), 64, 96)]
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("x_shape, C_in, C_out", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_fast_linear_equals_the_kernel(threads, dtype, x_shape, C_in, C_out, bias):
    rng = np.random.default_rng(sum(x_shape) + C_out)
    x = rng.standard_normal(x_shape).astype(dtype)
    W = rng.standard_normal((C_in, C_out)).astype(dtype)
    b = rng.standard_normal(C_out).astype(dtype) if bias else None
    dy = rng.standard_normal((*x_shape[:-1], C_out)).astype(dtype)
    y_ref, c_ref = ref.linear_forward(x, W, b)
    y, c = fast.linear_forward(x, W, b)
    assert_equal_to_kernel(y, y_ref, dtype)
    assert isinstance(c, ref.LinearCache) and c.has_b == bias
    for g, g_ref in zip(fast.linear_backward(dy, c), ref.linear_backward(dy, c_ref)):
        if g_ref is None:
            assert g is None
        else:
            assert_equal_to_kernel(g, g_ref, dtype)


def test_out_and_accumulate_equal_the_kernel(threads):
    rng = np.random.default_rng(7)
    x, W, b = rng.standard_normal((3, 40, 48)), rng.standard_normal((48, 64)), rng.standard_normal(64)
    dy = rng.standard_normal((3, 40, 64))
    out = np.empty((3, 40, 64))
    y, c = fast.linear_forward(x, W, b, out=out)
    y_ref, c_ref = ref.linear_forward(x, W, b)
    assert y.base is out or y is out
    assert_equal_to_kernel(out, y_ref, np.float64)
    gW0, gb0 = rng.standard_normal(W.shape), rng.standard_normal(64)
    gW, gb = gW0.copy(), gb0.copy()
    dx, gW_out, gb_out = fast.linear_backward(dy, c, accumulate=(gW, gb))
    dx_ref, dW_ref, db_ref = ref.linear_backward(dy, c_ref)
    assert gW_out is gW and gb_out is gb
    assert_equal_to_kernel(dx, dx_ref, np.float64)
    assert_equal_to_kernel(gW, gW0 + dW_ref, np.float64)
    assert_equal_to_kernel(gb, gb0 + db_ref, np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("x_shape, C_in, C_out", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_the_backward_without_dW_equals_the_kernel(threads, dtype, x_shape, C_in, C_out, bias):
    """dX = dY Wᵀ and db = 1ᵀ dY of a frozen W: fast equals the reference; with ``accumulate``
    db is added into b's gradient, with ``bias=False`` it is not formed."""
    rng = np.random.default_rng(sum(x_shape) + C_in)
    x = rng.standard_normal(x_shape).astype(dtype)
    W = rng.standard_normal((C_in, C_out)).astype(dtype)
    dy = rng.standard_normal((*x_shape[:-1], C_out)).astype(dtype)
    cache = ref.LinearCache(x, W, bias)
    dx_ref, db_ref = ref.linear_backward_without_dW(dy, cache)
    dx, db = fast.linear_backward_without_dW(dy, cache)
    assert dx.shape == x.shape and (db is None) == (db_ref is None) == (not bias)
    assert_equal_to_kernel(dx, dx_ref, dtype)
    dx_full, _, db_full = ref.linear_backward(dy, cache)         # the same dX and db as the whole
    assert_equal_to_kernel(dx_ref, dx_full, dtype)
    if bias:
        assert_equal_to_kernel(db, db_ref, dtype)
        assert_equal_to_kernel(db_ref, db_full, dtype)
        gb0 = rng.standard_normal(C_out).astype(dtype)
        gb = gb0.copy()
        assert fast.linear_backward_without_dW(dy, cache, accumulate=gb)[1] is gb
        assert_equal_to_kernel(gb, gb0 + db_ref, dtype)
    assert fast.linear_backward_without_dW(dy, cache, bias=False)[1] is None


@pytest.mark.parametrize("dt", [np.float64, np.float32, bfloat16, np.float16], ids=str)
def test_the_whole_backward_runs_the_backward_without_dW_for_dX_and_db(threads, dt):
    """``fast.linear.linear_backward``'s dX and db are ``linear_backward_without_dW``'s, bit for bit
    (one home for dX = dY Wᵀ), in every dtype the layers run."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64, 96)).astype(dt)
    W = rng.standard_normal((96, 128)).astype(dt)
    dy = rng.standard_normal((4, 64, 128)).astype(dt)
    cache = ref.LinearCache(x, W, True)
    gW, gb, gb2 = np.zeros((96, 128), dt), np.zeros(128, dt), np.zeros(128, dt)
    dx, _, _ = fast.linear_backward(dy, cache, accumulate=(gW, gb))
    dx2, _ = fast.linear_backward_without_dW(dy, cache, accumulate=gb2)
    assert dx.dtype == dx2.dtype == dt
    assert np.array_equal(dx, dx2) and np.array_equal(gb, gb2)
