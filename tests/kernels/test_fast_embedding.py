"""tformer.fast.embedding equals tformer.kernels.embedding: the sort-and-reduceat scatter is np.add.at."""
import numpy as np
import pytest
from fast_equal_pointwise import assert_equal_to_kernel

from tformer.fast import embedding as fast
from tformer.kernels import embedding as kern


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("B, T, V, C", [(1, 1, 3, 2), (2, 7, 5, 4), (8, 64, 50, 16)])
def test_fast_embedding_equals_the_kernel(dtype, B, T, V, C):
    rng = np.random.default_rng(0)
    W = rng.standard_normal((V, C)).astype(dtype)
    tokens = rng.integers(0, V, (B, T))                # repeats: several positions per row of W
    dE = rng.standard_normal((B, T, C)).astype(dtype)
    E, cache = fast.embedding_forward(tokens, W)
    E_k, cache_k = kern.embedding_forward(tokens, W)
    assert_equal_to_kernel(E, E_k, dtype)
    assert_equal_to_kernel(fast.embedding_backward(dE, cache), kern.embedding_backward(dE, cache_k), dtype)
