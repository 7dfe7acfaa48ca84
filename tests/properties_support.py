"""The shared part of the property-based tests (tests/kernels/test_properties*.py): one bounded, deterministic
hypothesis profile, and strategies for shapes, dtypes and float arrays.

``PROFILE``: ``derandomize=True`` (the examples are a function of the test's code, so CI sees the
same ones on every run), no example database (nothing written between runs), ``deadline=None``
(the machine is shared: a slow example is not a failure) and a bounded ``max_examples`` per test,
so that the whole property suite stays under about a minute on 2 cores. Raise it locally with
``TFORMER_HYPOTHESIS_EXAMPLES=500`` to search harder.
"""
import os

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tformer.core.gradcheck import check_kernel  # noqa: F401  (re-exported for the tests)

EXAMPLES = int(os.environ.get("TFORMER_HYPOTHESIS_EXAMPLES", "20"))
PROFILE = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                   print_blob=False)
FEW = settings(PROFILE, max_examples=max(5, EXAMPLES // 2))

FLOATS = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16),
          np.dtype(ml_dtypes.bfloat16)]
#: The largest |x| drawn per dtype for products (attention scores, Q Kᵀ): float16's largest number
#: is 65504, so its q and k stay small enough that D·|q|·|k| fits; the others take large values.
BOUND = {np.dtype(np.float32): 1e3, np.dtype(np.float64): 1e3, np.dtype(np.float16): 4.0,
         np.dtype(ml_dtypes.bfloat16): 4.0}
#: The largest |x| drawn per dtype for elementwise and normalising kernels.
WIDE = {np.dtype(np.float32): 1e4, np.dtype(np.float64): 1e4, np.dtype(np.float16): 6e4,
        np.dtype(ml_dtypes.bfloat16): 1e4}
#: Finite-difference tolerance (float64, h = 1e-6: truncation and rounding errors near 1e-9).
FD_TOL = 1e-6

dtypes = st.sampled_from(FLOATS)


def dims(min_size=1, max_size=4):
    return st.integers(min_size, max_size)


def shapes(min_dims=0, max_dims=3, min_side=1, max_side=4):
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


@st.composite
def arrays(draw, shape, dtype, bound=None, special=True):
    """A float array of ``shape`` and ``dtype`` with finite entries in [−bound, bound].

    Drawn as a seed plus a magnitude, then shaped by NumPy (fast, any size); with ``special``, a
    few entries are overwritten with hypothesis' own picks from {0, ±bound, ±tiny, ...}: where
    the edge cases live.
    """
    dtype = np.dtype(dtype)
    bound = WIDE[dtype] if bound is None else bound
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from([1e-3, 1.0, 3.0, bound]))
    rng = np.random.default_rng(seed)
    x = np.asarray(np.clip(rng.standard_normal(shape) * scale, -bound, bound))
    if special and x.size:
        n = draw(st.integers(0, min(3, x.size)))
        for _ in range(n):
            i = draw(st.integers(0, x.size - 1))
            x.flat[i] = draw(st.sampled_from([0.0, bound, -bound, 1e-30, -1e-30, 0.5, -2.0]))
    return np.asarray(x, dtype=dtype)


def rand64(seed, shape, scale=1.0):
    """Standard normal float64 data for gradient checks (away from kinks with probability 1)."""
    return np.random.default_rng(seed).standard_normal(shape) * scale


def finite(*xs):
    return all(np.isfinite(np.asarray(x, dtype=np.float64)).all() for x in xs)
