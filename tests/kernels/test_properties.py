"""Property-based tests of the row-wise and elementwise kernels (hypothesis; profile in
tests/properties_support.py). For each kernel: random shapes (including empty ones) and dtypes,
the forward is finite on finite input and so is the backward; in float64 on small shapes the
backward agrees with central differences under a random upstream gradient; shapes that do not fit
raise ValueError. Attention, flash attention, RoPE and SwiGLU: tests/kernels/test_properties_attention.py.
"""
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from properties_support import (FD_TOL, FEW, PROFILE, arrays, check_kernel, dtypes, finite,
                                rand64, shapes)

from tformer.nn import functional as F
from tformer.core.gradcheck import numerical_grad

ELEMENTWISE = {
    "relu": (F.relu_forward, F.relu_backward),
    "relu2": (F.relu2_forward, F.relu2_backward),
    "sigmoid": (F.sigmoid_forward, F.sigmoid_backward),
    "swish": (F.swish_forward, F.swish_backward),
    "gelu_tanh": (lambda x: F.gelu_forward(x, "tanh"), F.gelu_backward),
    "gelu_none": (lambda x: F.gelu_forward(x, "none"), F.gelu_backward),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@PROFILE
@given(data=st.data(), shape=shapes(0, 3, 0, 5), dtype=dtypes)
def test_elementwise_forward_and_backward_are_finite(name, data, shape, dtype):
    fwd, bwd = ELEMENTWISE[name]
    x = data.draw(arrays(shape, dtype))
    if name == "relu2":       # x² and 2x·dy must fit the dtype (float16 ends at 65504 = 256²)
        r = np.maximum(x.astype(np.float64), 0)
        assume(np.isfinite((r * np.maximum(r, 20)).astype(dtype)).all())
    y, cache = fwd(x)
    assert y.shape == x.shape and y.dtype == x.dtype and finite(y)
    dy = data.draw(arrays(shape, dtype, bound=10.0))
    dx = bwd(dy, cache)
    assert dx.shape == x.shape and dx.dtype == x.dtype and finite(dx)


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@FEW
@given(shape=shapes(1, 3, 1, 4), seed=st.integers(0, 2**16), scale=st.sampled_from([0.1, 1.0, 4.0]))
def test_elementwise_backward_matches_finite_differences(name, shape, seed, scale):
    fwd, bwd = ELEMENTWISE[name]
    x = rand64(seed, shape, scale)
    assume(name not in ("relu", "relu2") or np.abs(x).min() > 1e-4)   # the kinks at 0
    assert check_kernel(fwd, bwd, [x], seed=seed) < FD_TOL


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@FEW
@given(shape=shapes(1, 3, 1, 4), extra=st.integers(1, 3))
def test_elementwise_backward_refuses_a_gradient_of_another_shape(name, shape, extra):
    fwd, bwd = ELEMENTWISE[name]
    _, cache = fwd(np.ones(shape))
    with pytest.raises(ValueError, match="dy"):
        bwd(np.ones((*shape[:-1], shape[-1] + extra)), cache)


@PROFILE
@given(data=st.data(), shape=shapes(1, 3, 0, 5), dtype=dtypes, mask=st.booleans())
def test_softmax_is_a_distribution_and_finite(data, shape, dtype, mask):
    x = data.draw(arrays(shape, dtype))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    if mask and x.size:                                          # −inf entries: masked, even whole rows
        x = np.where(np.random.default_rng(x.size).random(shape) < 0.4, -np.inf, x).astype(dtype)
    s, cache = F.softmax_forward(x, axis=axis)
    assert s.shape == x.shape and s.dtype == x.dtype and finite(s)
    sums = s.astype(np.float64).sum(axis=axis)
    live = np.isfinite(x.astype(np.float64)).any(axis=axis)
    tol = 1e-2 if dtype.itemsize == 2 else 1e-5
    np.testing.assert_allclose(sums[live], 1.0, atol=tol)      # a distribution where a key is visible
    np.testing.assert_array_equal(sums[~live], 0.0)             # all masked: zeros, not NaN
    ds = data.draw(arrays(shape, dtype, bound=10.0))
    assert finite(F.softmax_backward(ds, cache))


@FEW
@given(shape=shapes(1, 3, 1, 4), seed=st.integers(0, 2**16), scale=st.sampled_from([0.1, 1.0, 5.0]))
def test_softmax_backward_matches_finite_differences(shape, seed, scale):
    axis = seed % len(shape)
    x = rand64(seed, shape, scale)
    # h = 1e-5: a saturated softmax (p ≈ 1 next to p ≈ 1e-6) has gradients of ~1e-4, where the
    # rounding noise of h = 1e-6, ~1e-16 |L| / h, is ~1e-6 of them; the O(h²) error stays ~1e-10.
    assert check_kernel(lambda a: F.softmax_forward(a, axis=axis), F.softmax_backward, [x],
                        seed=seed, h=1e-5) < FD_TOL


NORMS = {
    "layernorm": (lambda x, g, b: F.layernorm_forward(x, g, b), F.layernorm_backward, 2),
    "rmsnorm": (lambda x, g: F.rmsnorm_forward(x, g), F.rmsnorm_backward, 1),
}


@pytest.mark.parametrize("name", sorted(NORMS))
@PROFILE
@given(data=st.data(), lead=shapes(0, 2, 0, 3), C=st.integers(1, 6), dtype=dtypes,
       constant=st.booleans())
def test_norms_are_finite(name, data, lead, C, dtype, constant):
    fwd, bwd, n_params = NORMS[name]
    x = data.draw(arrays((*lead, C), dtype))
    if constant:                                                 # var = 0 (or a zero row): ε keeps it finite
        x = np.broadcast_to(x[..., :1], x.shape).copy()
    params = [data.draw(arrays((C,), dtype, bound=3.0)) for _ in range(n_params)]
    y, cache = fwd(x, *params)
    assert y.shape == x.shape and y.dtype == x.dtype and finite(y)
    grads = bwd(data.draw(arrays(x.shape, dtype, bound=10.0)), cache)
    assert all(g.shape == a.shape for g, a in zip(grads, [x, *params])) and finite(*grads)


@pytest.mark.parametrize("name", sorted(NORMS))
@FEW
@given(lead=shapes(1, 2, 1, 3), C=st.integers(2, 6), seed=st.integers(0, 2**16),
       scale=st.sampled_from([0.1, 1.0, 10.0]))
def test_norms_backward_matches_finite_differences(name, lead, C, seed, scale):
    fwd, bwd, n_params = NORMS[name]
    inputs = [rand64(seed, (*lead, C), scale)] + [rand64(seed + 1 + i, (C,)) for i in range(n_params)]
    assert check_kernel(fwd, bwd, inputs, seed=seed) < FD_TOL


@pytest.mark.parametrize("name", sorted(NORMS))
@FEW
@given(C=st.integers(1, 6), wrong=st.integers(1, 7))
def test_norms_refuse_parameters_of_another_size(name, C, wrong):
    assume(wrong != C)
    fwd, _, n_params = NORMS[name]
    with pytest.raises(ValueError, match="gamma|beta"):
        fwd(np.ones((2, C)), *[np.ones(wrong)] * n_params)


@PROFILE
@given(data=st.data(), lead=shapes(0, 2, 0, 3), C_in=st.integers(1, 5), C_out=st.integers(1, 5),
       dtype=dtypes, bias=st.booleans())
def test_linear_is_finite(data, lead, C_in, C_out, dtype, bias):
    x = data.draw(arrays((*lead, C_in), dtype, bound=30.0))
    W = data.draw(arrays((C_in, C_out), dtype, bound=3.0))
    b = data.draw(arrays((C_out,), dtype, bound=3.0)) if bias else None
    y, cache = F.linear_forward(x, W, b)
    assert y.shape == (*lead, C_out) and y.dtype == dtype and finite(y)
    dx, dW, db = F.linear_backward(data.draw(arrays(y.shape, dtype, bound=3.0)), cache)
    assert dx.shape == x.shape and dW.shape == W.shape and finite(dx, dW)
    assert (db is None) == (not bias) and (db is None or (db.shape == (C_out,) and finite(db)))


@FEW
@given(lead=shapes(1, 2, 1, 3), C_in=st.integers(1, 4), C_out=st.integers(1, 4),
       seed=st.integers(0, 2**16), bias=st.booleans())
def test_linear_backward_matches_finite_differences(lead, C_in, C_out, seed, bias):
    inputs = [rand64(seed, (*lead, C_in)), rand64(seed + 1, (C_in, C_out))]
    if bias:
        inputs.append(rand64(seed + 2, (C_out,)))

    def bwd(dy, cache):
        dx, dW, db = F.linear_backward(dy, cache)
        return (dx, dW, db) if bias else (dx, dW)
    assert check_kernel(F.linear_forward, bwd, inputs, seed=seed) < FD_TOL


@FEW
@given(C_in=st.integers(1, 5), wrong=st.integers(1, 6), C_out=st.integers(1, 4))
def test_linear_refuses_shapes_that_do_not_fit(C_in, wrong, C_out):
    assume(wrong != C_in)
    with pytest.raises(ValueError, match="W"):
        F.linear_forward(np.ones((2, C_in)), np.ones((wrong, C_out)))
    with pytest.raises(ValueError, match="b"):
        F.linear_forward(np.ones((2, C_in)), np.ones((C_in, C_out)), np.ones(C_out + 1))


@PROFILE
@given(data=st.data(), shape=shapes(0, 2, 0, 4), V=st.integers(1, 6), C=st.integers(1, 4), dtype=dtypes)
def test_embedding_gathers_and_scatters(data, shape, V, C, dtype):
    tokens = np.random.default_rng(V * 7 + C).integers(0, V, size=shape)
    W = data.draw(arrays((V, C), dtype))
    E, cache = F.embedding_forward(tokens, W)
    assert E.shape == (*shape, C)
    np.testing.assert_array_equal(E, W[tokens])
    dE = data.draw(arrays(E.shape, dtype, bound=3.0))
    dW = F.embedding_backward(dE, cache)
    want = np.zeros((V, C))
    np.add.at(want, tokens.ravel(), dE.reshape(-1, C).astype(np.float64))
    tol = 5e-2 if dtype.itemsize == 2 else 1e-5
    np.testing.assert_allclose(dW.astype(np.float64), want, atol=tol * (1 + np.abs(want).max(initial=0)))


@FEW
@given(V=st.integers(1, 5), C=st.integers(1, 3), bad=st.sampled_from([-1, 0]))
def test_embedding_refuses_tokens_out_of_range(V, C, bad):
    tokens = np.array([[0, V if bad == 0 else -1]])
    with pytest.raises(ValueError, match=rf"tokens: expected values in \[0, {V}\)"):
        F.embedding_forward(tokens, np.ones((V, C)))


@PROFILE
@given(data=st.data(), shape=shapes(0, 3, 0, 5), dtype=dtypes, p=st.sampled_from([0.0, 0.1, 0.5, 0.9]),
       seed=st.integers(0, 2**16))
def test_dropout_is_finite_and_unbiased_per_kept_entry(data, shape, dtype, p, seed):
    x = data.draw(arrays(shape, dtype, bound=100.0))
    y, mask = F.dropout_forward(x, p, np.random.default_rng(seed))
    assert y.shape == x.shape and finite(y)
    dy = data.draw(arrays(shape, dtype, bound=3.0))
    dx = F.dropout_backward(dy, mask)
    assert finite(dx)
    if mask is not None:                                          # kept entries scaled by 1/(1 − p)
        kept = mask != 0
        np.testing.assert_allclose(mask[kept].astype(np.float64), 1 / (1 - p), rtol=1e-2)
        np.testing.assert_array_equal(y[~kept], 0)


@FEW
@given(p=st.sampled_from([-0.1, 1.0, 1.5, float("nan")]))
def test_dropout_refuses_a_probability_outside_zero_one(p):
    with pytest.raises(ValueError, match="p: expected a drop probability"):
        F.dropout_forward(np.ones(3), p, np.random.default_rng(0))


@PROFILE
@given(data=st.data(), lead=shapes(1, 2, 1, 4), V=st.integers(1, 6), dtype=dtypes,
       ignore=st.booleans())
def test_cross_entropy_is_finite_and_its_gradient_sums_to_zero(data, lead, V, dtype, ignore):
    z = data.draw(arrays((*lead, V), dtype))
    t = np.random.default_rng(V).integers(0, V, size=lead)
    if ignore:
        t.flat[0] = -100
    loss, dz = F.cross_entropy(z, t, ignore_index=-100 if ignore else None)
    assert np.isfinite(loss) and loss >= 0 and dz.shape == z.shape and finite(dz)
    tol = 1e-2 if dtype.itemsize == 2 else 1e-5
    np.testing.assert_allclose(dz.astype(np.float64).sum(axis=-1), 0.0, atol=tol)   # Σ_v (p − onehot)


@FEW
@given(lead=shapes(1, 2, 1, 3), V=st.integers(2, 5), seed=st.integers(0, 2**16),
       reduction=st.sampled_from(["ce", "mean", "half_sum", "sum"]))
def test_losses_gradient_matches_finite_differences(lead, V, seed, reduction):
    z = rand64(seed, (*lead, V), 3.0)
    if reduction == "ce":
        t = np.random.default_rng(seed).integers(0, V, size=lead)

        def loss():
            return F.cross_entropy(z, t)
    else:
        target = rand64(seed + 1, z.shape)

        def loss():
            return F.mse_loss(z, target, reduction)
    _, grad = loss()
    num, idx = numerical_grad(lambda: loss()[0], z)
    assert np.abs(grad.reshape(-1)[idx] - num).max() < FD_TOL * max(1.0, np.abs(num).max())


@FEW
@given(lead=shapes(1, 2, 1, 3), V=st.integers(1, 5))
def test_losses_refuse_shapes_and_targets_that_do_not_fit(lead, V):
    with pytest.raises(ValueError, match="targets: expected shape"):
        F.cross_entropy(np.zeros((*lead, V)), np.zeros((*lead, 2), np.int64))
    with pytest.raises(ValueError, match=rf"targets: expected values in \[0, {V}\)"):
        F.cross_entropy(np.zeros((*lead, V)), np.full(lead, V))
    with pytest.raises(ValueError, match="target"):
        F.mse_loss(np.zeros((*lead, V)), np.zeros((*lead, V + 1)))


@FEW
@given(T=st.integers(1, 50), C=st.integers(1, 16).map(lambda c: 2 * c), dtype=dtypes)
def test_sinusoidal_positions_are_bounded(T, C, dtype):
    for bad_T, bad_C in ((0, C), (T, C - 1), (T, 0)):
        with pytest.raises(ValueError, match="C: expected an even model width"):
            F.sinusoidal_positions(bad_T, bad_C, dtype)
    pe = F.sinusoidal_positions(T, C, dtype)
    assert pe.shape == (T, C) and pe.dtype == dtype and finite(pe)
    assert np.abs(pe.astype(np.float64)).max(initial=0) <= 1.0


@FEW
@given(shape=shapes(1, 3, 0, 3).filter(lambda s: 0 in s), V=st.integers(1, 4))
def test_losses_on_empty_input(shape, V):
    """Sums over nothing are 0; a mean over nothing raises ValueError naming y (it was a
    ZeroDivisionError); cross-entropy over no targets is 0, as when every target is ignored."""
    y = np.zeros(shape)
    for reduction in ("sum", "half_sum"):
        loss, dy = F.mse_loss(y, y.copy(), reduction)
        assert loss == 0.0 and dy.shape == shape
    with pytest.raises(ValueError, match="y: reduction='mean' needs at least one element"):
        F.mse_loss(y, y.copy())
    loss, dz = F.cross_entropy(np.zeros((*shape, V)), np.zeros(shape, np.int64))
    assert loss == 0.0 and dz.shape == (*shape, V)
