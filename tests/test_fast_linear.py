"""tformer.fast.linear equals tformer.kernels.linear (the chapter's equations): float64 to ~1e-12,
float32 to ~1e-5, with one thread and with two (the threaded sizes), with out= and accumulate=."""
import numpy as np
import pytest
from fast_equal_pointwise import assert_equal_to_kernel, threads  # noqa: F401

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
