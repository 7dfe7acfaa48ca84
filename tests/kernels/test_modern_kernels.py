"""The modern block's kernels: RMSNorm, RoPE, SwiGLU and grouped-query attention.

Finite differences in float64 with a random upstream gradient, the properties each one is built
for, and clear errors on bad input. PyTorch parity is in ``test_torch_parity_modern.py``.
"""
import tracemalloc

import numpy as np
import pytest

import tformer.nn.functional as F
from tformer.core.gradcheck import check_kernel


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# --- RMSNorm ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shift,scale,eps", [(0.0, 1.0, 1e-6), (3.0, 0.1, 1e-6), (0.0, 1e-3, 1e-2)])
def test_rmsnorm_gradcheck(shift, scale, eps):
    x = shift + scale * randn(2, 3, 8, seed=1)
    err = check_kernel(F.rmsnorm_forward, F.rmsnorm_backward, [x, randn(8, seed=2)], kwargs={"eps": eps})
    assert err < 1e-7


def test_rmsnorm_forward_is_the_formula_and_keeps_the_dtype():
    for dtype in (np.float32, np.float64):
        x, gamma = randn(4, 5, 16, seed=3).astype(dtype), randn(16, seed=4).astype(dtype)
        y, _ = F.rmsnorm_forward(x, gamma, eps=1e-6)
        x64 = x.astype(np.float64)
        want = gamma * x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6)
        assert y.dtype == dtype and y.shape == x.shape
        np.testing.assert_allclose(y, want, rtol=1e-5 if dtype == np.float32 else 1e-13)


def test_rmsnorm_is_scale_invariant_but_not_shift_invariant_and_zero_rows_stay_finite():
    x, gamma, dy = randn(3, 10, seed=5), randn(10, seed=6), randn(3, 10, seed=7)
    y, cache = F.rmsnorm_forward(x, gamma, eps=1e-12)
    np.testing.assert_allclose(F.rmsnorm_forward(7.5 * x, gamma, eps=1e-12)[0], y, rtol=1e-10)
    assert not np.allclose(F.rmsnorm_forward(x + 1.0, gamma)[0], y, atol=1e-3)
    dx, _ = F.rmsnorm_backward(dy, cache)
    np.testing.assert_allclose(np.einsum("nc,nc->n", dx, x), 0, atol=1e-9)   # scale invariance: dx ⟂ x
    y0, c0 = F.rmsnorm_forward(np.zeros((2, 10)), gamma)
    dx0, dg0 = F.rmsnorm_backward(dy[:2], c0)
    assert np.array_equal(y0, np.zeros((2, 10))) and np.isfinite(dx0).all() and np.array_equal(dg0, np.zeros(10))
    np.testing.assert_allclose(dx0, gamma * dy[:2] / np.sqrt(1e-6), rtol=1e-12)   # rstd = 1/√ε


def test_rmsnorm_rejects_bad_input():
    x = randn(2, 4)
    with pytest.raises(ValueError, match=r"gamma: expected shape \(4,\)"):
        F.rmsnorm_forward(x, np.ones(5))
    with pytest.raises(ValueError, match="eps: expected a positive number"):
        F.rmsnorm_forward(x, np.ones(4), eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        F.rmsnorm_forward(x, np.ones(4), eps=float("nan"))
    with pytest.raises(TypeError, match="dtype mismatch"):
        F.rmsnorm_forward(x, np.ones(4, np.float32))
    with pytest.raises(TypeError, match="x: expected a NumPy"):
        F.rmsnorm_forward(x.tolist(), np.ones(4))
    _, cache = F.rmsnorm_forward(x, np.ones(4))
    with pytest.raises(ValueError, match=r"dy: expected shape \(2, 4\)"):
        F.rmsnorm_backward(randn(4, 2), cache)


# --- RoPE ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("positions", [None, 5, np.array([3, 0, 7, 7, 100]), np.array([0.5, 1.5, -2.0, 9.25, 4.0])])
def test_rope_gradcheck(positions):
    err = check_kernel(F.rope_forward, F.rope_backward, [randn(2, 3, 5, 8, seed=8)],
                       kwargs={"positions": positions, "base": 100.0})
    assert err < 1e-7


def test_rope_rotates_interleaved_pairs_by_position_times_frequency():
    T, D, base = 6, 8, 10000.0
    x = randn(2, T, D, seed=9)
    y, _ = F.rope_forward(x, base=base)
    theta = base ** (-np.arange(0, D, 2) / D)                              # (D/2,)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * np.arange(T)[:, None] * theta)
    np.testing.assert_allclose(y[..., 0::2], z.real, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(y[..., 1::2], z.imag, rtol=1e-13, atol=1e-14)
    pair_norm = np.hypot(x[..., 0::2], x[..., 1::2])
    np.testing.assert_allclose(np.hypot(y[..., 0::2], y[..., 1::2]), pair_norm, rtol=1e-13)
    assert np.array_equal(y[:, 0], x[:, 0])                               # position 0: identity


def test_rope_scores_depend_only_on_the_distance():
    q, k = randn(4, 16, seed=10), randn(4, 16, seed=11)                  # 4 (query, key) vector pairs
    m, n = np.array([0, 3, 10, 50]), np.array([2, 1, 4, 49])
    def scores(shift):
        qm, _ = F.rope_forward(q, positions=m + shift)
        kn, _ = F.rope_forward(k, positions=n + shift)
        return np.einsum("td,td->t", qm, kn)
    s0 = scores(0)
    for shift in (1, 17, 1000):
        np.testing.assert_allclose(scores(shift), s0, rtol=1e-9, atol=1e-12)
    assert not np.allclose(s0, np.einsum("td,td->t", q, k))                # but positions matter


def test_rope_offset_is_the_slice_of_the_whole_sequence_and_backward_is_the_inverse():
    x = randn(2, 3, 12, 8, seed=12)
    full, _ = F.rope_forward(x)
    tail, cache = F.rope_forward(x[..., 7:, :], positions=7)
    assert np.array_equal(tail, full[..., 7:, :])                           # the KV-cache case
    assert np.array_equal(F.rope_forward(x[..., 7:, :], positions=np.arange(7, 12))[0], tail)
    np.testing.assert_allclose(F.rope_backward(tail, cache), x[..., 7:, :], rtol=1e-13, atol=1e-14)
    dy = randn(2, 3, 5, 8, seed=13)
    dx = F.rope_backward(dy, cache)
    alias = dy.copy()
    assert F.rope_backward(alias, cache, out=alias) is alias and np.array_equal(alias, dx)
    buf = np.zeros((2, 5, 3, 8))                                           # a head-merged view as out
    F.rope_backward(dy, cache, out=buf.transpose(0, 2, 1, 3))
    assert np.array_equal(buf.transpose(0, 2, 1, 3), dx)


def test_rope_float32_and_rope_angles():
    x = randn(3, 4, 6, seed=14).astype(np.float32)
    y, _ = F.rope_forward(x, positions=2)
    assert y.dtype == np.float32
    cos, sin = F.rope_angles(np.arange(2, 6), 6)
    assert cos.shape == sin.shape == (4, 3)
    np.testing.assert_allclose(cos ** 2 + sin ** 2, 1, rtol=1e-15)
    np.testing.assert_allclose(F.rope_forward(x.astype(np.float64), positions=2)[0], y, rtol=1e-5, atol=1e-6)


def test_rope_rejects_bad_input():
    x = randn(2, 5, 8)
    with pytest.raises(ValueError, match="even last axis D"):
        F.rope_forward(randn(2, 5, 7))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        F.rope_forward(randn(8))
    with pytest.raises(ValueError, match=r"positions: expected shape \(5,\)"):
        F.rope_forward(x, positions=np.arange(4))
    with pytest.raises(ValueError, match="positions: expected an offset ≥ 0"):
        F.rope_forward(x, positions=-1)
    with pytest.raises(ValueError, match="positions: contains NaN"):
        F.rope_forward(x, positions=np.array([0, 1, np.nan, 3, 4]))
    with pytest.raises(TypeError, match="positions"):
        F.rope_forward(x, positions=np.ones(5, bool))
    with pytest.raises(TypeError, match="positions"):
        F.rope_forward(x, positions=2.5)
    for base in (0.0, -10.0, float("inf"), True):
        with pytest.raises(ValueError, match="base: expected a positive finite number"):
            F.rope_forward(x, base=base)
    with pytest.raises(ValueError, match="D: expected an even head size"):
        F.rope_angles(np.arange(3), 5)
    _, cache = F.rope_forward(x)
    with pytest.raises(ValueError, match=r"dy: expected shape \(2, 5, 8\)"):
        F.rope_backward(randn(2, 5, 6), cache)
    with pytest.raises(ValueError, match="out: expected"):
        F.rope_backward(randn(2, 5, 8), cache, out=np.zeros((2, 5, 8), np.float32))


# --- SwiGLU ----------------------------------------------------------------------------------------

def test_swiglu_gradcheck_and_equals_swish_times_b():
    a, b = 2 * randn(3, 4, 6, seed=15), randn(3, 4, 6, seed=16)
    assert check_kernel(F.swiglu_forward, F.swiglu_backward, [a, b]) < 1e-7
    y, _ = F.swiglu_forward(a, b)
    np.testing.assert_allclose(y, F.swish_forward(a)[0] * b, rtol=1e-14, atol=1e-15)


def test_swiglu_on_the_two_halves_of_one_buffer_with_out():
    h = randn(2, 5, 12, seed=17)                                            # (B, T, 2 d_ff)
    a, b = h[..., :6], h[..., 6:]
    y, cache = F.swiglu_forward(a, b)
    dy = randn(2, 5, 6, seed=18)
    da, db = F.swiglu_backward(dy, cache)
    dh = np.empty_like(h)
    out = F.swiglu_backward(dy, cache, out=(dh[..., :6], dh[..., 6:]))
    assert np.shares_memory(out[0], dh) and np.array_equal(dh, np.concatenate([da, db], -1))
    y2, c2 = F.swiglu_forward(a.copy(), b.copy())
    assert np.array_equal(y, y2) and np.array_equal(F.swiglu_backward(dy, c2)[0], da)


def test_swiglu_large_inputs_stay_finite():
    a = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0])
    b = np.full(5, 2.0)
    y, cache = F.swiglu_forward(a, b)
    da, db = F.swiglu_backward(np.ones(5), cache)
    assert np.isfinite(y).all() and np.isfinite(da).all() and np.isfinite(db).all()
    np.testing.assert_allclose(y, [0, -50 * 2 / (1 + np.exp(50)), 0, 100, 2000], atol=1e-12)
    np.testing.assert_allclose(da, [0, 2 * F.swish_backward(np.ones(1), F.swish_forward(np.array([-50.0]))[1])[0],
                                    1.0, 2.0, 2.0], rtol=1e-12, atol=1e-12)


def test_swiglu_rejects_bad_input():
    with pytest.raises(ValueError, match=r"b: expected the shape of a, \(2, 3\)"):
        F.swiglu_forward(randn(2, 3), randn(3, 2))
    with pytest.raises(TypeError, match="dtype mismatch"):
        F.swiglu_forward(randn(2, 3), randn(2, 3).astype(np.float32))
    with pytest.raises(TypeError, match="a: expected dtype float32, float64, float16 or bfloat16"):
        F.swiglu_forward(np.ones((2, 3), int), randn(2, 3))
    _, cache = F.swiglu_forward(randn(2, 3), randn(2, 3))
    with pytest.raises(ValueError, match=r"dy: expected shape \(2, 3\)"):
        F.swiglu_backward(randn(3, 2), cache)
    with pytest.raises(ValueError, match="out: expected two"):
        F.swiglu_backward(randn(2, 3), cache, out=(np.empty((2, 3)),))


# --- grouped-query attention -----------------------------------------------------------------------

def gqa_inputs(B=2, H=6, H_kv=2, T=5, T_k=None, D=4, D_v=3, seed=20):
    T_k = T if T_k is None else T_k
    return randn(B, H, T, D, seed=seed), randn(B, H_kv, T_k, D, seed=seed + 1), randn(B, H_kv, T_k, D_v, seed=seed + 2)


MASKS = {
    "none": lambda T, T_k: {},
    "causal": lambda T, T_k: {"is_causal": True},
    "causal_mask": lambda T, T_k: {"mask": F.causal_mask(T, T_k)},
    "padding": lambda T, T_k: {"mask": F.padding_mask(np.array([[1] * (T_k - 2) + [0, 0], [1] * T_k]))},
    "additive": lambda T, T_k: {"mask": np.where(F.causal_mask(T, T_k), 0.0, -np.inf) + 0.3 * randn(T, T_k, seed=9)},
    "per_head": lambda T, T_k: {"mask": randn(2, 6, T, T_k, seed=7) > -1.0},
}


@pytest.mark.parametrize("H_kv", [1, 2, 3, 6])
@pytest.mark.parametrize("mask", list(MASKS))
def test_gqa_equals_multi_head_attention_on_repeated_keys_and_values(H_kv, mask):
    """Same outputs; dQ the same; dK, dV are the repeated heads' gradients summed per group."""
    T, T_k = (5, 5) if mask == "causal" else (4, 7)
    q, k, v = gqa_inputs(H_kv=H_kv, T=T, T_k=T_k)
    kw = MASKS[mask](T, T_k)
    G = 6 // H_kv
    y, cache = F.attention_forward(q, k, v, **kw)
    y_rep, cache_rep = F.attention_forward(q, np.repeat(k, G, 1), np.repeat(v, G, 1), **kw)
    np.testing.assert_allclose(y, y_rep, rtol=1e-14, atol=1e-15)
    assert cache[1] is k and cache[2] is v                                  # no copies kept
    dy = randn(*y.shape, seed=30)
    dq, dk, dv = F.attention_backward(dy, cache)
    dq_r, dk_r, dv_r = F.attention_backward(dy, cache_rep)
    np.testing.assert_allclose(dq, dq_r, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(dk, dk_r.reshape(2, H_kv, G, T_k, 4).sum(2), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dv, dv_r.reshape(2, H_kv, G, T_k, 3).sum(2), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("mask", ["none", "causal", "padding", "additive"])
def test_gqa_gradcheck(mask):
    T, T_k = (5, 5) if mask == "causal" else (4, 7)
    q, k, v = gqa_inputs(T=T, T_k=T_k, seed=40)
    assert check_kernel(F.attention_forward, F.attention_backward, [q, k, v], kwargs=MASKS[mask](T, T_k)) < 1e-7


def test_gqa_three_dimensional_call_and_scale():
    q, k, v = gqa_inputs(seed=60)
    for kw in ({}, {"is_causal": True}, {"scale": 0.3}):
        y3, _ = F.attention_forward(q[1], k[1], v[1], **kw)
        y4, _ = F.attention_forward(q, k, v, **kw)
        np.testing.assert_allclose(y3, y4[1], rtol=1e-14, atol=1e-15)
        assert check_kernel(F.attention_forward, F.attention_backward, [q[1], k[1], v[1]], kwargs=kw) < 1e-7


def test_gqa_writes_into_head_merged_views():
    B, T, H, H_kv, D = 2, 5, 4, 2, 3
    q, k, v = gqa_inputs(B, H, H_kv, T, D=D, D_v=D, seed=70)
    merged = np.empty((B, T, H * D))
    view = merged.reshape(B, T, H, D).transpose(0, 2, 1, 3)
    y, cache = F.attention_forward(q, k, v, is_causal=True, out=view)
    assert y is view and np.array_equal(F.merge_heads(F.attention_forward(q, k, v, is_causal=True)[0]), merged)
    dy = randn(B, H, T, D, seed=71)
    fused = np.empty((B, T, (H + 2 * H_kv) * D))                           # (B, T, C + 2 H_kv D)
    dq_v = fused[..., :H * D].reshape(B, T, H, D).transpose(0, 2, 1, 3)
    dk_v = fused[..., H * D:(H + H_kv) * D].reshape(B, T, H_kv, D).transpose(0, 2, 1, 3)
    dv_v = fused[..., (H + H_kv) * D:].reshape(B, T, H_kv, D).transpose(0, 2, 1, 3)
    F.attention_backward(dy, cache, out=(dq_v, dk_v, dv_v))
    for a, b in zip((dq_v, dk_v, dv_v), F.attention_backward(dy, cache)):
        assert np.array_equal(a, b)


def test_gqa_forward_does_not_copy_keys_and_values():
    """Peak memory of the forward: scores + output + the scaled Q, not G copies of K and V."""
    q, k, v = gqa_inputs(B=2, H=8, H_kv=1, T=16, D=64, D_v=64, seed=80)
    F.attention_forward(q, k, v)                                            # warm up
    tracemalloc.start()
    y, cache = F.attention_forward(q, k, v)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    needed = cache[3].nbytes + y.nbytes + q.nbytes                          # S (= P), y, scale · Q
    repeated = 2 * 8 * k.nbytes                                             # K and V repeated 8 times
    assert peak < needed + repeated / 4, (peak, needed, repeated)


def test_gqa_rejects_bad_input():
    q, k, v = gqa_inputs(H=6, H_kv=4)
    with pytest.raises(ValueError, match=r"H = 6 query heads to be a multiple of the key/value heads H_kv, got H_kv = 4"):
        F.attention_forward(q, k, v)
    q, k, v = gqa_inputs(H=6, H_kv=2)
    with pytest.raises(ValueError, match="k, v: leading axes differ"):
        F.attention_forward(q, k, v[:, :1])
    with pytest.raises(ValueError, match="q, k, v: leading axes differ"):
        F.attention_forward(q[:1], k, v)
    with pytest.raises(ValueError, match="H_kv, got H_kv = 4"):                # 3-D: (H, T, D)
        F.attention_forward(q[0], np.concatenate([k[0], k[0]]), np.concatenate([v[0], v[0]]))
    with pytest.raises(ValueError, match="mask: shape"):
        F.attention_forward(q, k, v, mask=np.ones((2, 4, 5, 5), bool))
    _, cache = F.attention_forward(q, k, v)
    with pytest.raises(ValueError, match=r"dy: expected shape \(2, 6, 5, 3\)"):
        F.attention_backward(randn(2, 2, 5, 3), cache)
    with pytest.raises(ValueError, match=r"out\[1\] \(dk\)"):
        F.attention_backward(randn(2, 6, 5, 3), cache, out=(np.empty(q.shape), np.empty(q.shape), np.empty(v.shape)))
