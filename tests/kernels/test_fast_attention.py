"""tformer.fast.attention equals tformer.kernels.attention (the chapter's equations): float64 to
~1e-12, float32 to ~1e-5, with one thread and with two; masks (boolean, additive, all-masked
rows), the causal tiles (``is_causal``, several tiles), grouped-query heads (against the kernel on
K and V repeated per query head) and out= buffers.

Then the causal path (``is_causal``) on its own, every check of it in this one file: its softmax
shifted by each query's own score s_ii instead of the row maximum gives the masked path's values
and gradients (float32 and float64, grouped heads, one thread and two), falls back to the maximum
where the shift does not fit, refuses NaN and +inf as the masked path does, passes finite
differences and equals PyTorch's ``scaled_dot_product_attention(is_causal=True)``."""
import numpy as np
import pytest
from fast_equal_pointwise import assert_equal_to_kernel, threads  # noqa: F401

from tformer.nn import functional as F
from tformer.fast import attention as fast
from tformer.fast.softmax import _softmax_shifted_inplace
from tformer.core.gradcheck import check_kernel
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


# --- the causal path: the softmax shifted by s_ii -------------------------------------------------

@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-13)])
def test_any_shift_within_the_row_gives_the_softmax(dtype, tol):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 40)) * 8).astype(dtype)
    want, _ = F.softmax_forward(x)
    for col in (0, 17, 39):                              # any entry of the row as the shift
        got = x.copy()
        assert _softmax_shifted_inplace(got, x[:, col:col + 1].copy())
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_the_shift_reports_what_does_not_fit():
    x = np.zeros((3, 8), np.float32)
    x[1, 5] = 100.0                                      # e^{100 − 0} overflows float32
    assert not _softmax_shifted_inplace(x.copy(), np.zeros((3, 1), np.float32))
    y = np.zeros((2, 8), np.float32)
    y[0, 3] = np.nan
    assert not _softmax_shifted_inplace(y.copy(), np.zeros((2, 1), np.float32))
    z = np.zeros((2, 8), np.float32)
    z[1, 0] = np.inf
    assert not _softmax_shifted_inplace(z.copy(), np.zeros((2, 1), np.float32))
    w = np.zeros((2, 8), np.float32)                     # the shift itself is +inf: sums are 0
    assert not _softmax_shifted_inplace(w.copy(), np.full((2, 1), np.inf, np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("H_kv", [4, 2])
@pytest.mark.parametrize("T", [1, 5, 32, 33, 64, 70, 130, 150])    # one tile, tile edges, three tiles
def test_causal_path_equals_the_masked_one(threads, dtype, H_kv, T):
    """Shifting by s_ii instead of the maximum changes the exponents' arguments, so the last bits:
    scores of a few units (|s| up to about 10 here) agree to float rounding times |s|. P is exactly
    0 above the diagonal. Gradients in float64 (the float32 ones: the kernel comparison above)."""
    rng = np.random.default_rng(T)
    q = (rng.standard_normal((2, 4, T, 8)) * 2).astype(dtype)
    k, v = ((rng.standard_normal((2, H_kv, T, 8)) * 2).astype(dtype) for _ in range(2))
    got, cache = F.attention_forward(q, k, v, is_causal=True)
    want, masked = F.attention_forward(q, k, v, mask=F.causal_mask(T))
    rtol, atol = (1e-5, 1e-5) if dtype == np.float32 else (1e-13, 1e-14)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    np.testing.assert_allclose(cache[3], masked[3], rtol=rtol, atol=atol)
    assert (np.triu(cache[3], 1) == 0).all()
    if dtype == np.float64:
        dy = rng.standard_normal(got.shape)
        for a, b in zip(F.attention_backward(dy, cache), F.attention_backward(dy, masked)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
            assert np.abs(a - b).max() < 1e-12


def test_a_score_far_above_the_own_one_falls_back_to_the_maximum():
    """Query 40 sees key 3 with a score 200 above its own (e^200 overflows float32, and
    float64 too once scaled up): the tile is recomputed with the row maximum, and the result is
    the masked path's, with no warning and no NaN."""
    T, D = 64, 4
    q = np.zeros((1, 1, T, D))
    k = np.zeros((1, 1, T, D))
    q[0, 0, 40, 0], k[0, 0, 3, 0] = 40.0, 10.0           # s = 400 / √D = 200 for (40, 3)
    for dtype in (np.float32, np.float64):
        qd, kd = q.astype(dtype), k.astype(dtype) * (1 if dtype == np.float32 else 8)
        v = np.random.default_rng(1).standard_normal((1, 1, T, D)).astype(dtype)
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            got, cache = F.attention_forward(qd, kd, v, is_causal=True)
        want, _ = F.attention_forward(qd, kd, v, mask=F.causal_mask(T))
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert cache[3][0, 0, 40, 3] == pytest.approx(1.0)


def test_nan_and_inf_in_the_scores_still_raise():
    T = 8
    q, k, v = (np.random.default_rng(2).standard_normal((1, 2, T, 4)).astype(np.float32)
               for _ in range(3))
    for bad in (np.nan, np.inf):
        kb = k.copy()
        kb[0, 1, 2, 0] = bad                             # seen by queries 2 … 7 of head 1
        with pytest.raises(ValueError, match="NaN or \\+inf"):
            F.attention_forward(q, kb, v, is_causal=True)


def test_causal_path_refuses_nan_like_the_masked_path():
    q = np.random.default_rng(5).standard_normal((1, 2, 70, 4))
    q[0, 1, 66, 2] = np.nan                                    # in the second tile
    for kw in ({"is_causal": True}, {"mask": F.causal_mask(70)}):
        with pytest.raises(ValueError, match="x: contains NaN or \\+inf"):
            F.attention_forward(q, q, q, **kw)


# --- the causal path: gradients and PyTorch -------------------------------------------------------

def test_causal_path_gradcheck_and_errors():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 40, 3)) for _ in range(3))
    assert check_kernel(F.attention_forward, F.attention_backward, [q, k, v],
                        kwargs={"is_causal": True}) < 1e-6
    with pytest.raises(ValueError, match="mask: must be None when is_causal=True"):
        F.attention_forward(q, k, v, F.causal_mask(40), is_causal=True)
    with pytest.raises(ValueError, match="is_causal: needs T_q = T_k"):
        F.attention_forward(q[:, :, :5], k, v, is_causal=True)
    y, _ = F.attention_forward(q[0, 0], k[0, 0], v[0, 0], is_causal=True)   # one (T, D) sequence
    y_ref, _ = F.attention_forward(q[0, 0], k[0, 0], v[0, 0], F.causal_mask(40))
    assert np.abs(y - y_ref).max() < 1e-12


def test_causal_path_matches_torch_sdpa_float64(torch):
    rng = np.random.default_rng(1)
    q, k, v, dy = (rng.standard_normal((2, 2, 70, 4)) for _ in range(4))
    y, cache = F.attention_forward(q, k, v, is_causal=True)
    grads = F.attention_backward(dy, cache)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    ty = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    ty.backward(torch.tensor(dy))
    assert np.abs(y - ty.detach().numpy()).max() < 1e-12
    for g, t in zip(grads, (tq, tk, tv)):
        assert np.abs(g - t.grad.numpy()).max() < 1e-12
