"""Shared by tests/kernels/test_fast_*.py: the thread-count fixture and the check that a fast kernel equals
its reference kernel."""
import numpy as np
import pytest

from tformer.core import parallel

TOL = {np.float64: 1e-12, np.float32: 1e-5}


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = parallel.set_num_threads(request.param)
    yield request.param
    parallel.set_num_threads(before)


def assert_equal_to_kernel(fast, kernel, dtype):
    """|fast − kernel| ≤ tol · max|kernel|, entry by entry (tol: 1e-12 in float64, 1e-5 in float32),
    both of shape and dtype alike, the dtype ``dtype``."""
    fast, kernel = np.asarray(fast), np.asarray(kernel)
    assert fast.shape == kernel.shape and fast.dtype == kernel.dtype == np.dtype(dtype)
    scale = max(float(np.abs(kernel).max(initial=0.0)), np.finfo(dtype).tiny)
    err = float(np.abs(fast.astype(np.float64) - kernel.astype(np.float64)).max(initial=0.0))
    assert err <= TOL[dtype] * scale, (err, scale)
