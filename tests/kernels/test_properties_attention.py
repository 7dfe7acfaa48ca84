"""Property-based tests of attention (plain and flash), RoPE, SwiGLU and the head reshapes
(hypothesis; profile in tests/properties_support.py): random batch, heads, grouped-query heads,
lengths (including empty ones), masks (none, boolean, additive, causal) and scales; the forward is
finite on finite input; plain and flash attention agree; in float64 on small shapes the backward
agrees with central differences; shapes that do not fit raise ValueError.
"""
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from properties_support import (BOUND, FD_TOL, FEW, PROFILE, arrays, check_kernel, dtypes, finite,
                                rand64, shapes)

from tformer.nn import functional as F

KERNELS = {"plain": (F.attention_forward, F.attention_backward),
           "flash": (F.flash_attention_forward, F.flash_attention_backward)}


@st.composite
def problems(draw, min_T=0, max_T=6, max_D=4):
    """(q shape, k shape, v shape, mask or None, is_causal, scale): batch 0–2, heads 1–4 with a
    divisor as key/value heads (grouped-query attention), T_q, T_k, D, D_v small."""
    B = draw(st.integers(0, 2))
    H_kv = draw(st.integers(1, 2))
    H = H_kv * draw(st.integers(1, 2))
    T_q, T_k = draw(st.integers(min_T, max_T)), draw(st.integers(min_T, max_T))
    D, D_v = draw(st.integers(1, max_D)), draw(st.integers(1, max_D))
    causal = draw(st.booleans()) and T_q == T_k
    kind = draw(st.sampled_from(["none", "bool", "additive"])) if not causal else "none"
    scale = draw(st.sampled_from([None, 1.0, 0.01, 3.0]))
    mask = None
    if kind != "none":            # broadcastable: (T_q, T_k), (B, 1, 1, T_k) or the full shape
        form = draw(st.sampled_from([(T_q, T_k), (B, 1, 1, T_k), (B, H, T_q, T_k)]))
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        keep = rng.random(form) < 0.7
        mask = keep if kind == "bool" else np.where(keep, rng.standard_normal(form), -np.inf)
    return (B, H, T_q, D), (B, H_kv, T_k, D), (B, H_kv, T_k, D_v), mask, causal, scale


def _qkv(data, problem, dtype):
    qs, ks, vs = problem[:3]
    return [data.draw(arrays(s, dtype, bound=BOUND[dtype])) for s in (qs, ks, vs)]


def _mask_for(mask, dtype):
    return mask if mask is None or mask.dtype == bool else mask.astype(np.float64)


@pytest.mark.parametrize("name", sorted(KERNELS))
@PROFILE
@given(data=st.data(), problem=problems(), dtype=dtypes)
def test_attention_is_finite_and_rows_without_keys_are_zero(name, data, problem, dtype):
    fwd, bwd = KERNELS[name]
    q, k, v = _qkv(data, problem, dtype)
    mask, causal, scale = problem[3:]
    y, cache = fwd(q, k, v, mask=mask, scale=scale, is_causal=causal)
    assert y.shape == (*q.shape[:-1], v.shape[-1]) and y.dtype == dtype and finite(y)
    dy = data.draw(arrays(y.shape, dtype, bound=3.0))
    grads = bwd(dy, cache)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape] and finite(*grads)
    if mask is not None:          # a query with no visible key: y = 0 exactly, not NaN
        visible = np.broadcast_to(mask if mask.dtype == bool else np.isfinite(mask),
                                  (*q.shape[:-1], k.shape[-2])).any(axis=-1)
        assert not np.asarray(y, dtype=np.float64)[~visible].any()


@PROFILE
@given(data=st.data(), problem=problems(min_T=1, max_T=9), block_q=st.integers(1, 4),
       block_k=st.integers(1, 4))
def test_flash_and_plain_attention_agree(data, problem, block_q, block_k):
    q, k, v = _qkv(data, problem, np.dtype(np.float64))
    mask, causal, scale = problem[3:]
    y0, c0 = F.attention_forward(q, k, v, mask=mask, scale=scale, is_causal=causal)
    y1, c1 = F.flash_attention_forward(q, k, v, mask=mask, scale=scale, is_causal=causal,
                                       block_q=block_q, block_k=block_k)
    dy = data.draw(arrays(y0.shape, np.dtype(np.float64), bound=3.0))
    size = max(1.0, np.abs(v).max(initial=0))
    np.testing.assert_allclose(y1, y0, rtol=1e-9, atol=1e-9 * size)
    for g0, g1 in zip(F.attention_backward(dy, c0), F.flash_attention_backward(dy, c1)):
        np.testing.assert_allclose(g1, g0, rtol=1e-7, atol=1e-7 * max(1.0, np.abs(g0).max(initial=0)))


@pytest.mark.parametrize("name", sorted(KERNELS))
@FEW
@given(problem=problems(min_T=1, max_T=3, max_D=3), seed=st.integers(0, 2**16))
def test_attention_backward_matches_finite_differences(name, problem, seed):
    fwd, bwd = KERNELS[name]
    (qs, ks, vs), (mask, causal, scale) = problem[:3], problem[3:]
    assume(qs[0] > 0)
    inputs = [rand64(seed + i, s) for i, s in enumerate((qs, ks, vs))]
    kwargs = dict(mask=mask, scale=scale, is_causal=causal)
    assert check_kernel(fwd, bwd, inputs, kwargs=kwargs, seed=seed) < FD_TOL


@pytest.mark.parametrize("name", sorted(KERNELS))
@FEW
@given(problem=problems(min_T=1, max_T=4), which=st.sampled_from(["D", "T_v", "heads", "rank", "mask"]))
def test_attention_refuses_shapes_that_do_not_fit(name, problem, which):
    fwd, _ = KERNELS[name]
    qs, ks, vs = (list(s) for s in problem[:3])
    mask = None
    if which == "D":
        ks[-1] += 1
    elif which == "T_v":
        vs[-2] += 1
    elif which == "heads":                 # H_kv must divide H: H + 1 key heads never does
        ks[1] = vs[1] = qs[1] + 1
    elif which == "rank":
        vs = vs[1:]
    else:
        mask = np.ones((qs[2] + 1, ks[2] + 2), bool)
    with pytest.raises(ValueError):
        fwd(np.ones(qs), np.ones(ks), np.ones(vs), mask=mask)


@FEW
@given(T_q=st.integers(1, 4), extra=st.integers(1, 3))
def test_plain_causal_attention_refuses_fewer_keys_than_queries(T_q, extra):
    q = np.ones((1, 1, T_q + extra, 2))
    k = np.ones((1, 1, T_q, 2))
    for fwd in (F.attention_forward, F.flash_attention_forward):
        with pytest.raises(ValueError, match="is_causal"):
            fwd(q, k, k, is_causal=True)


@PROFILE
@given(data=st.data(), lead=shapes(0, 2, 0, 2), T=st.integers(0, 5), half=st.integers(1, 3),
       dtype=dtypes, offset=st.integers(0, 1000))
def test_rope_is_finite_and_keeps_lengths(data, lead, T, half, dtype, offset):
    # |x| ≤ BOUND: a rotation keeps each pair's length, which must fit float16 (√2 · 6e4 does not)
    x = data.draw(arrays((*lead, T, 2 * half), dtype, bound=BOUND[dtype]))
    y, cache = F.rope_forward(x, positions=offset)
    assert y.shape == x.shape and y.dtype == dtype and finite(y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    pairs = (*x.shape[:-1], half, 2)
    tol = 1e-2 if dtype.itemsize == 2 else 1e-5
    np.testing.assert_allclose(np.hypot(*np.moveaxis(y64.reshape(pairs), -1, 0)),
                               np.hypot(*np.moveaxis(x64.reshape(pairs), -1, 0)),
                               rtol=tol, atol=tol)             # each pair is rotated, not scaled
    dy = data.draw(arrays(x.shape, dtype, bound=3.0))
    assert finite(F.rope_backward(dy, cache))


@FEW
@given(lead=shapes(0, 2, 1, 2), T=st.integers(1, 4), half=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_rope_backward_matches_finite_differences(lead, T, half, seed):
    x = rand64(seed, (*lead, T, 2 * half))
    assert check_kernel(lambda a: F.rope_forward(a, positions=seed % 7), F.rope_backward, [x],
                        seed=seed) < FD_TOL


@FEW
@given(T=st.integers(1, 4), half=st.integers(0, 3))
def test_rope_refuses_an_odd_head_size(T, half):
    with pytest.raises(ValueError, match="D|even"):
        F.rope_forward(np.ones((2, T, 2 * half + 1)))


@PROFILE
@given(data=st.data(), shape=shapes(0, 3, 0, 4), dtype=dtypes)
def test_swiglu_is_finite(data, shape, dtype):
    a = data.draw(arrays(shape, dtype, bound=50.0))
    b = data.draw(arrays(shape, dtype, bound=50.0))
    y, cache = F.swiglu_forward(a, b)
    assert y.shape == a.shape and y.dtype == dtype and finite(y)
    da, db = F.swiglu_backward(data.draw(arrays(shape, dtype, bound=3.0)), cache)
    assert da.shape == db.shape == a.shape and da.dtype == db.dtype == dtype and finite(da, db)


@FEW
@given(shape=shapes(1, 3, 1, 3), seed=st.integers(0, 2**16), scale=st.sampled_from([0.3, 1.0, 5.0]))
def test_swiglu_backward_matches_finite_differences(shape, seed, scale):
    a, b = rand64(seed, shape, scale), rand64(seed + 1, shape)
    assert check_kernel(F.swiglu_forward, F.swiglu_backward, [a, b], seed=seed) < FD_TOL


@FEW
@given(shape=shapes(1, 3, 1, 3), extra=st.integers(1, 2))
def test_swiglu_refuses_halves_of_different_shapes(shape, extra):
    with pytest.raises(ValueError, match="b"):
        F.swiglu_forward(np.ones(shape), np.ones((*shape[:-1], shape[-1] + extra)))


@FEW
@given(B=st.integers(0, 2), T=st.integers(0, 3), H=st.integers(1, 3), D=st.integers(1, 3),
       wrong=st.integers(2, 5))
def test_split_and_merge_heads_are_inverse_and_refuse_a_non_divisor(B, T, H, D, wrong):
    x = np.arange(B * T * H * D, dtype=np.float64).reshape(B, T, H * D)
    heads = F.split_heads(x, H)
    assert heads.shape == (B, H, T, D)
    np.testing.assert_array_equal(F.merge_heads(heads), x)
    assume((H * D) % wrong)
    with pytest.raises(ValueError, match="n_heads: must divide C"):
        F.split_heads(x, wrong)
