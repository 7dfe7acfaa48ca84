"""tformer.fast.softmax equals tformer.kernels.softmax (the chapter's equation), forward and backward."""
import numpy as np
import pytest
from fast_equal_pointwise import assert_equal_to_kernel, threads  # noqa: F401

from tformer.fast import softmax as fast
from tformer.kernels import softmax as kern


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, axis", [((7,), -1), ((3, 5, 9), -1), ((3, 5, 9), 1), ((2048, 64), -1)])
def test_fast_softmax_equals_the_kernel(threads, dtype, shape, axis):
    rng = np.random.default_rng(0)
    x = (3 * rng.standard_normal(shape)).astype(dtype)
    x.flat[::5] = -np.inf                               # masked entries (no row masked whole)
    x.flat[1] = 0.0
    ds = rng.standard_normal(shape).astype(dtype)
    s, cache = fast.softmax_forward(x, axis)
    s_k, cache_k = kern.softmax_forward(x, axis)
    assert_equal_to_kernel(s, s_k, dtype)
    assert_equal_to_kernel(fast.softmax_backward(ds, cache), kern.softmax_backward(ds, cache_k), dtype)


def test_the_inplace_softmax_of_attention_equals_the_kernel():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 16, 16))
    assert_equal_to_kernel(fast._softmax_inplace(x.copy()), kern.softmax_forward(x)[0], np.float64)
    m = x.max(axis=-1, keepdims=True) - 0.5
    shifted = x.copy()
    assert fast._softmax_shifted_inplace(shifted, m)
    assert_equal_to_kernel(shifted, kern.softmax_forward(x)[0], np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_samplers_softmax_is_the_kernel_to_the_bit(dtype):
    """fast.softmax.softmax (what the samplers draw from) does the kernel's operations in its order:
    equal to softmax_forward bit for bit; softmax_weights is π / max π, its top entry exactly 1."""
    rng = np.random.default_rng(2)
    z = (4 * rng.standard_normal((6, 50))).astype(dtype)
    z[:, ::7] = -np.inf                                   # filtered tokens (a sampler's −∞)
    s = fast.softmax(z)
    s_k = kern.softmax_forward(z)[0]
    assert_equal_to_kernel(s, s_k, dtype)
    assert np.array_equal(s, s_k)                         # tolerance 0: the same operations
    w = fast.softmax_weights(z)
    assert w.dtype == np.dtype(dtype) and np.all(w.max(axis=-1) == 1) and np.all(w[:, ::7] == 0)
    assert_equal_to_kernel(w, s_k / s_k.max(axis=-1, keepdims=True), dtype)
