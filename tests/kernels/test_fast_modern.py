"""tformer.fast.{rmsnorm,swiglu,rope} equal tformer.kernels.{rmsnorm,swiglu,rope} (The modern block's
equations): float64 to 1e-12 and float32 to 1e-5 relative, on 1 and 2 threads, with every option
(``out=``, position offsets and arrays, strided halves); float16 and bfloat16 through ``F`` against
the float32 kernel on the same (rounded) inputs, to a few units of the format's last place."""
import numpy as np
import pytest
from fast_equal_pointwise import assert_equal_to_kernel, threads  # noqa: F401

import tformer.nn.functional as F
from tformer.core.dtypes import bfloat16, float16
from tformer.fast import rmsnorm as fast_rms
from tformer.fast import rope as fast_rope
from tformer.fast import swiglu as fast_swiglu
from tformer.kernels import rmsnorm as kern_rms
from tformer.kernels import rope as kern_rope
from tformer.kernels import swiglu as kern_swiglu

SHAPES = [(8,), (3, 5, 16), (2, 1024, 64)]                     # 2048 rows of 64: split across threads
ROPE_SHAPES = [(5, 8), (3, 6, 16), (8, 4, 64, 32)]             # (B, H, T, D): split across threads


def normal(shape, dtype, seed, scale=1.0, shift=0.0):
    return (shift + scale * np.random.default_rng(seed).standard_normal(shape)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_fast_rmsnorm_equals_the_kernel(threads, dtype, shape):
    x, dy = normal(shape, dtype, 0, 2.0, 0.5), normal(shape, dtype, 1)
    x[(0,) * (len(shape) - 1)] = 0.0                           # one zero row: y = 0, rstd = 1/√ε
    gamma = normal(shape[-1], dtype, 2)
    y, cache = fast_rms.rmsnorm_forward(x, gamma, 1e-5)
    y_k, cache_k = kern_rms.rmsnorm_forward(x, gamma, 1e-5)
    assert_equal_to_kernel(y, y_k, dtype)
    assert_equal_to_kernel(cache.rstd, cache_k.rstd, dtype)
    for g, g_k in zip(fast_rms.rmsnorm_backward(dy, cache), kern_rms.rmsnorm_backward(dy, cache_k)):
        assert_equal_to_kernel(g, g_k, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_fast_swiglu_equals_the_kernel_also_on_halves_and_with_out(threads, dtype, shape):
    h = normal((*shape[:-1], 2 * shape[-1]), dtype, 3, 3.0)   # (…, 2 d_ff): a, b its two halves
    a, b = h[..., :shape[-1]], h[..., shape[-1]:]
    dy = normal(shape, dtype, 4)
    y, cache = fast_swiglu.swiglu_forward(a, b)
    y_k, cache_k = kern_swiglu.swiglu_forward(a, b)
    assert_equal_to_kernel(y, y_k, dtype)
    assert_equal_to_kernel(cache.sig, cache_k.sig, dtype)
    grads_k = kern_swiglu.swiglu_backward(dy, cache_k)
    for g, g_k in zip(fast_swiglu.swiglu_backward(dy, cache), grads_k):
        assert_equal_to_kernel(g, g_k, dtype)
    dh = np.empty_like(h)
    da, db = fast_swiglu.swiglu_backward(dy, cache, out=(dh[..., :shape[-1]], dh[..., shape[-1]:]))
    assert np.shares_memory(da, dh) and np.shares_memory(db, dh)
    assert_equal_to_kernel(dh, np.concatenate(grads_k, -1), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", ROPE_SHAPES)
@pytest.mark.parametrize("positions", [None, 0, 7, "array", "fractions"])
def test_fast_rope_equals_the_kernel_at_every_kind_of_position(threads, dtype, shape, positions):
    T = shape[-2]
    positions = {"array": np.arange(3, 3 + T)[::-1], "fractions": np.linspace(-2.0, 9.5, T)}.get(
        positions, positions) if isinstance(positions, str) else positions
    x, dy = normal(shape, dtype, 5), normal(shape, dtype, 6)
    for base in (10000.0, 100.0):
        y, cache = fast_rope.rope_forward(x, positions, base)
        y_k, cache_k = kern_rope.rope_forward(x, positions, base)
        assert_equal_to_kernel(y, y_k, dtype)
        assert_equal_to_kernel(cache.cos, cache_k.cos, dtype)
        assert_equal_to_kernel(cache.sin, cache_k.sin, dtype)
        dx_k = kern_rope.rope_backward(dy, cache_k)
        assert_equal_to_kernel(fast_rope.rope_backward(dy, cache), dx_k, dtype)
        alias = dy.copy()
        assert fast_rope.rope_backward(alias, cache, out=alias) is alias     # out= the input itself
        assert_equal_to_kernel(alias, dx_k, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fast_rope_on_a_strided_head_view_and_into_a_view(threads, dtype):
    qkv = normal((4, 64, 3, 4, 32), dtype, 7)                  # (B, T, 3, H, D): q, k, v fused
    q = qkv[:, :, 0].transpose(0, 2, 1, 3)                      # (B, H, T, D), a strided view
    y, cache = fast_rope.rope_forward(q, 5)
    y_k, cache_k = kern_rope.rope_forward(q, 5)
    assert_equal_to_kernel(y, y_k, dtype)
    dy = normal(q.shape, dtype, 8)
    buf = np.zeros((4, 64, 4, 32), dtype)
    fast_rope.rope_backward(dy, cache, out=buf.transpose(0, 2, 1, 3))
    assert_equal_to_kernel(buf.transpose(0, 2, 1, 3), kern_rope.rope_backward(dy, cache_k), dtype)


LOW_TOL = {float16: 4 * 2.0 ** -10, bfloat16: 4 * 2.0 ** -7}     # a few units of the last place


def assert_close_in_format(low, kernel32, dtype):
    """|low − kernel| ≤ tol · max|kernel| (tol: a few units of the low format's last place)."""
    assert low.dtype == dtype
    err = float(np.abs(low.astype(np.float64) - kernel32.astype(np.float64)).max(initial=0.0))
    assert err <= LOW_TOL[dtype] * max(float(np.abs(kernel32).max(initial=0.0)), 1e-30), err


@pytest.mark.parametrize("dtype", [float16, bfloat16])
def test_low_precision_through_F_is_the_float32_kernel_to_the_format(threads, dtype):
    f32 = lambda a: a.astype(np.float32)                        # noqa: E731
    x, dy, gamma = normal((2, 1024, 64), dtype, 9, 2.0), normal((2, 1024, 64), dtype, 10), normal(64, dtype, 11)
    y, cache = F.rmsnorm_forward(x, gamma)
    y_k, cache_k = kern_rms.rmsnorm_forward(f32(x), f32(gamma), 1e-6)
    assert_close_in_format(y, y_k, dtype)
    for g, g_k in zip(F.rmsnorm_backward(dy, cache), kern_rms.rmsnorm_backward(f32(dy), cache_k)):
        assert_close_in_format(g, g_k, dtype)
    a, b = normal((2, 1024, 64), dtype, 12, 3.0), normal((2, 1024, 64), dtype, 13)
    y, cache = F.swiglu_forward(a, b)
    y_k, cache_k = kern_swiglu.swiglu_forward(f32(a), f32(b))
    assert_close_in_format(y, y_k, dtype)
    for g, g_k in zip(F.swiglu_backward(dy, cache), kern_swiglu.swiglu_backward(f32(dy), cache_k)):
        assert_close_in_format(g, g_k, dtype)
    q, dq = normal((8, 4, 64, 32), dtype, 14), normal((8, 4, 64, 32), dtype, 15)
    y, cache = F.rope_forward(q, 3)
    y_k, cache_k = kern_rope.rope_forward(f32(q), 3)
    assert_close_in_format(y, y_k, dtype)
    assert_close_in_format(F.rope_backward(dq, cache), kern_rope.rope_backward(f32(dq), cache_k), dtype)
