"""tformer.fast.layernorm equals tformer.kernels.layernorm (the chapter's equations)."""
import numpy as np
import pytest
from fast_equal_pointwise import assert_equal_to_kernel, threads  # noqa: F401

from tformer.fast import layernorm as fast
from tformer.kernels import layernorm as kern


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(1, 8), (3, 5, 16), (2, 1024, 64)])   # 2048 rows of 64: split
def test_fast_layernorm_equals_the_kernel(threads, dtype, shape):
    rng = np.random.default_rng(0)
    C = shape[-1]
    x = (2.0 + 3 * rng.standard_normal(shape)).astype(dtype)
    x[(0,) * (len(shape) - 1)] = 1.5                    # one constant row: x̂ = 0, y = β
    gamma, beta = rng.standard_normal(C).astype(dtype), rng.standard_normal(C).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y, cache = fast.layernorm_forward(x, gamma, beta, 1e-5)
    y_k, cache_k = kern.layernorm_forward(x, gamma, beta, 1e-5)
    assert_equal_to_kernel(y, y_k, dtype)
    assert_equal_to_kernel(cache.mu, cache_k.mu, dtype)
    assert_equal_to_kernel(cache.rstd, cache_k.rstd, dtype)
    for g, g_k in zip(fast.layernorm_backward(dy, cache), kern.layernorm_backward(dy, cache_k)):
        assert_equal_to_kernel(g, g_k, dtype)
