"""tformer.fast.dropout equals tformer.kernels.dropout: the same masks from the same generator."""
import numpy as np
import pytest
from fast_equal_pointwise import assert_equal_to_kernel

from tformer.fast import dropout as fast
from tformer.kernels import dropout as kern


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("p, training", [(0.1, True), (0.5, True), (0.0, True), (0.3, False)])
def test_fast_dropout_equals_the_kernel(dtype, p, training):
    x = np.random.default_rng(0).standard_normal((4, 8, 16)).astype(dtype)
    dy = np.random.default_rng(1).standard_normal(x.shape).astype(dtype)
    y, cache = fast.dropout_forward(x, p, np.random.default_rng(7), training)
    y_k, cache_k = kern.dropout_forward(x, p, np.random.default_rng(7), training)
    assert_equal_to_kernel(y, y_k, dtype)
    assert_equal_to_kernel(fast.dropout_backward(dy, cache), kern.dropout_backward(dy, cache_k), dtype)
