"""LayerNorm, every check in one place (the family's file, as tests/kernels/test_fast_*.py are): the kernel
(tformer/kernels/layernorm.py), its fast version (tformer/fast/layernorm.py) and the checked
boundary (``F.layernorm_forward``/``_backward``).

- the fast version equals the kernel (one thread and two, float32 and float64, a constant row);
- float64 central differences for x, γ and β;
- PyTorch's ``layer_norm`` in float64 (values and every gradient, a constant row included);
- a constant row (variance 0) gives y = β and finite gradients in float32 and float64;
- the row means by BLAS handle 3-D and non-contiguous input.

Checks that run every kernel family through one table (float32 in float32 out, bad input, low
precision, properties, thread counts) stay in their own files.
"""
import numpy as np
import pytest
from fast_equal_pointwise import assert_equal_to_kernel, threads  # noqa: F401

import tformer.nn.functional as F
from tformer.fast import layernorm as fast
from tformer.core.gradcheck import check_kernel
from tformer.kernels import layernorm as kern


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# ---------------------------------------------------------------- the fast version equals the kernel

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


# ---------------------------------------------------------------- gradients: finite differences, PyTorch

def test_layernorm_gradcheck():
    x, g, b = randn(2, 3, 6, seed=6), randn(6, seed=7), randn(6, seed=8)
    assert check_kernel(F.layernorm_forward, F.layernorm_backward, [x, g, b]) < 1e-7


@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_layernorm_matches_torch(torch, eps):
    x, gam, bet, g = randn(2, 3, 6, seed=9), randn(6, seed=10), randn(6, seed=11), randn(2, 3, 6, seed=12)
    x[1, 2] = 0.7                                        # a constant row: var = 0, y = β
    y, cache = F.layernorm_forward(x, gam, bet, eps)
    grads = F.layernorm_backward(g, cache)
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, gam, bet)]
    ty = torch.nn.functional.layer_norm(ts[0], (6,), ts[1], ts[2], eps)
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    for a, t in zip(grads, ts):
        np.testing.assert_allclose(a, t.grad.numpy(), rtol=1e-11, atol=1e-11)


# ---------------------------------------------------------------- edge cases

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layernorm_of_a_constant_row(dtype):
    x = np.full((2, 5), 3.0, dtype)
    gamma, beta = np.arange(1, 6).astype(dtype), np.arange(5).astype(dtype)
    y, cache = F.layernorm_forward(x, gamma, beta)
    np.testing.assert_allclose(y, np.broadcast_to(beta, (2, 5)), atol=1e-6)
    dx, dgamma, dbeta = F.layernorm_backward(np.ones_like(x), cache)
    assert all(np.all(np.isfinite(g)) for g in (dx, dgamma, dbeta))


def test_layernorm_row_means_by_blas_handle_3d_and_noncontiguous_input():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 6, 10))[:, ::2]                  # (2, 3, 10), not contiguous
    g, b = rng.standard_normal(10), rng.standard_normal(10)
    y, cache = F.layernorm_forward(x, g, b)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    assert np.abs(y - ((x - mu) / np.sqrt(var + 1e-5) * g + b)).max() < 1e-13
    assert cache[2].shape == cache[3].shape == (2, 3, 1)
