"""tformer.fast.attention equals tformer.kernels.attention (the chapter's equations): float64 to
~1e-12, float32 to ~1e-5, with one thread and with two; masks (boolean, additive, all-masked
rows), the causal tiles (``is_causal``, several tiles), grouped-query heads (against the kernel on
K and V repeated per query head) and out= buffers."""
import numpy as np
import pytest
from fast_equal_pointwise import assert_equal_to_kernel, threads  # noqa: F401

from tformer.fast import attention as fast
from tformer.kernels import attention as ref

def _qkv(B, H, H_kv, T, T_k, D, dtype, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, T, D)).astype(dtype)
    k = rng.standard_normal((B, H_kv, T_k, D)).astype(dtype)
    v = rng.standard_normal((B, H_kv, T_k, D)).astype(dtype)
    dy = rng.standard_normal((B, H, T, D)).astype(dtype)
    return q, k, v, dy


def _both(q, k, v, dy, fast_kw, ref_mask, dtype, scale=None):
    G = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)     # the kernel has no grouped heads
    y_ref, c_ref = ref.attention_forward(q, kr, vr, ref_mask, scale)
    y, c = fast.attention_forward(q, k, v, scale=scale, **fast_kw)
    assert_equal_to_kernel(y, y_ref, dtype)
    assert_equal_to_kernel(c.P, c_ref.P, dtype)
    dq, dk, dv = fast.attention_backward(dy, c)
    dq_r, dk_r, dv_r = ref.attention_backward(dy, c_ref)
    B, H_kv, T_k, D = k.shape
    assert_equal_to_kernel(dq, dq_r, dtype)
    assert_equal_to_kernel(dk, dk_r.reshape(B, H_kv, G, T_k, D).sum(axis=2), dtype)   # a shared head: the sum
    assert_equal_to_kernel(dv, dv_r.reshape(B, H_kv, G, T_k, D).sum(axis=2), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("B, H, H_kv, T, D", [(2, 2, 2, 5, 3), (3, 4, 2, 70, 8), (2, 4, 1, 130, 16),
                                              (4, 4, 4, 64, 32)])
def test_causal_tiles_equal_the_kernel_with_the_causal_mask(threads, dtype, B, H, H_kv, T, D):
    q, k, v, dy = _qkv(B, H, H_kv, T, T, D, dtype, seed=T + H)
    _both(q, k, v, dy, {"is_causal": True}, ref.causal_mask(T), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["none", "bool", "additive", "padding", "all masked"])
@pytest.mark.parametrize("H_kv", [3, 1])
def test_masks_and_groups_equal_the_kernel(threads, dtype, kind, H_kv):
    B, H, T, T_k, D = 3, 3, 6, 9, 4
    q, k, v, dy = _qkv(B, H, H_kv, T, T_k, D, dtype, seed=11)
    rng = np.random.default_rng(12)
    mask = {"none": None,
            "bool": ref.causal_mask(T, T_k),
            "additive": np.where(ref.causal_mask(T, T_k), rng.standard_normal((T, T_k)), -np.inf).astype(dtype),
            "padding": rng.random((B, 1, 1, T_k)) > 0.3,
            "all masked": np.broadcast_to(np.arange(T)[:, None] != 2, (T, T_k)) & ref.causal_mask(T, T_k)}[kind]
    _both(q, k, v, dy, {"mask": mask}, mask, dtype, scale=0.4)


def test_one_sequence_without_batch_axes(threads):
    rng = np.random.default_rng(3)
    q, k, v, dy = (rng.standard_normal((7, 5)) for _ in range(4))
    for kw, mask in (({}, None), ({"is_causal": True}, ref.causal_mask(7))):
        y_ref, c_ref = ref.attention_forward(q, k, v, mask)
        y, c = fast.attention_forward(q, k, v, **kw)
        assert_equal_to_kernel(y, y_ref, np.float64)
        for g, g_ref in zip(fast.attention_backward(dy, c), ref.attention_backward(dy, c_ref)):
            assert_equal_to_kernel(g, g_ref, np.float64)


def test_out_buffers_equal_the_kernel(threads):
    B, H, T, D = 2, 4, 66, 8
    q, k, v, dy = _qkv(B, H, H, T, T, D, np.float64, seed=5)
    merged = np.empty((B, T, H * D))
    view = merged.reshape(B, T, H, D).transpose(0, 2, 1, 3)
    y, c = fast.attention_forward(q, k, v, is_causal=True, out=view)
    y_ref, c_ref = ref.attention_forward(q, k, v, ref.causal_mask(T))
    assert y is view
    assert_equal_to_kernel(ref.merge_heads(y_ref), merged, np.float64)
    bufs = tuple(np.empty(a.shape) for a in (q, k, v))
    got = fast.attention_backward(dy, c, out=bufs)
    for g, buf, g_ref in zip(got, bufs, ref.attention_backward(dy, c_ref)):
        assert g is buf
        assert_equal_to_kernel(g, g_ref, np.float64)


def test_split_and_merge_heads_are_inverse_reshapes():
    x = np.arange(2 * 3 * 8, dtype=np.float64).reshape(2, 3, 8)
    h = ref.split_heads(x, 4)
    assert h.shape == (2, 4, 3, 2) and np.array_equal(h[:, 1, :, :], x[:, :, 2:4])
    assert np.array_equal(ref.merge_heads(h), x)
