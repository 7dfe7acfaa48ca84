"""tformer.fast.activations equals tformer.kernels.activations (the chapter's equations)."""
import numpy as np
import pytest
from fast_equal_pointwise import assert_equal_to_kernel, threads  # noqa: F401

from tformer.fast import activations as fast
from tformer.kernels import activations as kern

NAMES = ["relu", "relu2", "sigmoid", "swish", "gelu"]


ACTIVATIONS = [("relu", {}), ("relu2", {}), ("sigmoid", {}), ("swish", {}), ("gelu", {"approximate": "tanh"}),
               ("gelu", {"approximate": "none"})]
SHAPES = [(5,), (4, 6, 8), (64, 2048)]                              # 2**17 elements: split in two
# The exact GELU calls math.erf per element: its two small shapes suffice (no split to test).
CASES = [(shape, name, kw) for shape in SHAPES for name, kw in ACTIVATIONS
         if not (kw.get("approximate") == "none" and shape[-1] == 2048)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, name, kw", CASES)
def test_fast_activation_equals_the_kernel(threads, dtype, shape, name, kw):
    rng = np.random.default_rng(0)
    x = (4 * rng.standard_normal(shape)).astype(dtype)
    x.flat[0] = -60.0                                  # far in the tails
    x.flat[-1] = 60.0
    dy = rng.standard_normal(shape).astype(dtype)
    f_fwd, f_bwd = getattr(fast, f"{name}_forward"), getattr(fast, f"{name}_backward")
    k_fwd, k_bwd = getattr(kern, f"{name}_forward"), getattr(kern, f"{name}_backward")
    y, cache = f_fwd(x, **kw)
    y_k, cache_k = k_fwd(x, **kw)
    assert_equal_to_kernel(y, y_k, dtype)
    assert_equal_to_kernel(f_bwd(dy, cache), k_bwd(dy, cache_k), dtype)
    if name == "gelu":                                 # the buffer version, written over dy
        out = dy.copy()
        assert f_bwd(out, cache, out=out) is out
        assert_equal_to_kernel(out, k_bwd(dy, cache_k), dtype)
