"""Every kernel against float64 central differences, dtype behaviour, stability cases and bad input.
A kernel family with a file of its own holds its checks there (LayerNorm: tests/kernels/test_fast_layernorm.py)."""
import numpy as np
import pytest

import tformer.nn.functional as F
from tformer.core.gradcheck import check_kernel

TOL = 1e-7


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(*shape, seed=0, dtype=np.float64):
    return rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- gradient checks (float64)

ELEMENTWISE = [
    ("relu", {}), ("relu2", {}), ("sigmoid", {}), ("swish", {}),
    ("gelu", {"approximate": "tanh"}), ("gelu", {"approximate": "none"}),
]


@pytest.mark.parametrize("name,kw", ELEMENTWISE)
def test_elementwise_gradcheck(name, kw):
    x = randn(3, 4, 5, seed=1)
    x[np.abs(x) < 1e-3] = 0.5          # keep ReLU's kink (and ReLU²'s) out of the stencil
    err = check_kernel(getattr(F, f"{name}_forward"), getattr(F, f"{name}_backward"), [x], kwargs=kw)
    assert err < TOL


@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradcheck(bias):
    x, W = randn(2, 3, 4, seed=1), randn(4, 5, seed=2)
    b = randn(5, seed=3) if bias else None
    assert check_kernel(F.linear_forward, F.linear_backward, [x, W, b]) < TOL


def test_embedding_gradcheck_with_repeated_tokens():
    tokens = np.array([[1, 3, 1, 0], [3, 3, 6, 1]])
    W = randn(7, 5, seed=4)
    assert check_kernel(F.embedding_forward, F.embedding_backward, [tokens, W]) < TOL
    dW = F.embedding_backward(np.ones((2, 4, 5)), F.embedding_forward(tokens, W)[1])
    np.testing.assert_array_equal(dW[:, 0], [1, 3, 0, 3, 0, 0, 1])   # counts per token, 0 for unused


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_gradcheck(axis):
    x = randn(3, 4, 5, seed=5)
    assert check_kernel(F.softmax_forward, F.softmax_backward, [x], kwargs={"axis": axis}) < TOL


def test_dropout_gradcheck_uses_the_same_mask():
    x = randn(4, 6, seed=9)
    err = check_kernel(lambda x: F.dropout_forward(x, 0.3, np.random.default_rng(1)),
                       F.dropout_backward, [x])
    assert err < TOL


@pytest.mark.parametrize("mask", [None, "causal", "padding", "additive"])
def test_attention_gradcheck(mask):
    q, k, v = randn(2, 3, 4, 5, seed=10), randn(2, 3, 4, 5, seed=11), randn(2, 3, 4, 6, seed=12)
    m = {None: None, "causal": F.causal_mask(4),
         "padding": F.padding_mask(np.array([[5, 2, 0, 0], [1, 1, 1, 0]])),
         "additive": randn(4, 4, seed=13)}[mask]
    assert check_kernel(F.attention_forward, F.attention_backward, [q, k, v], kwargs={"mask": m}) < TOL


def test_attention_gradcheck_cross_lengths_and_scale():
    q, k, v = randn(2, 3, 5, seed=14), randn(2, 7, 5, seed=15), randn(2, 7, 4, seed=16)
    err = check_kernel(F.attention_forward, F.attention_backward, [q, k, v], kwargs={"scale": 0.3})
    assert err < TOL


@pytest.mark.parametrize("reduction", ["mean", "half_sum", "sum"])
def test_mse_gradient(reduction):
    y, t = randn(2, 3, 4, seed=17), randn(2, 3, 4, seed=18)
    loss, dy = F.mse_loss(y, t, reduction)
    num = np.empty(y.size)
    h = 1e-6
    for i in range(y.size):
        yp, ym = y.copy().ravel(), y.copy().ravel()
        yp[i] += h
        ym[i] -= h
        num[i] = (F.mse_loss(yp.reshape(y.shape), t, reduction)[0]
                  - F.mse_loss(ym.reshape(y.shape), t, reduction)[0]) / (2 * h)
    np.testing.assert_allclose(dy.ravel(), num, rtol=1e-6, atol=1e-9)
    scale = {"mean": 1 / y.size, "half_sum": 0.5, "sum": 1.0}[reduction]
    assert loss == pytest.approx(scale * np.sum((y - t) ** 2), rel=1e-12)


@pytest.mark.parametrize("ignore", [None, 0])
def test_cross_entropy_gradient(ignore):
    z = randn(2, 4, 6, seed=19)
    t = np.array([[0, 3, 5, 0], [2, 0, 1, 4]])
    _, dz = F.cross_entropy(z, t, ignore)
    num = np.empty(z.size)
    h = 1e-6
    flat = z.ravel()
    for i in range(z.size):
        old = flat[i]
        flat[i] = old + h
        lp = F.cross_entropy(z, t, ignore)[0]
        flat[i] = old - h
        lm = F.cross_entropy(z, t, ignore)[0]
        flat[i] = old
        num[i] = (lp - lm) / (2 * h)
    np.testing.assert_allclose(dz.ravel(), num, rtol=1e-6, atol=1e-9)
    if ignore is not None:
        assert np.all(dz[t == ignore] == 0)


def test_cross_entropy_value_against_definition():
    z = randn(5, 7, seed=20)
    t = np.array([0, 6, 3, 3, 1])
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    loss, dz = F.cross_entropy(z, t)
    assert loss == pytest.approx(-np.mean(np.log(p[np.arange(5), t])), rel=1e-12)
    onehot = np.eye(7)[t]
    np.testing.assert_allclose(dz, (p - onehot) / 5, atol=1e-15)


# ---------------------------------------------------------------- dtype preserved

def _float32_cases():
    x = randn(2, 3, 4, seed=21, dtype=np.float32)
    W = randn(4, 4, seed=22, dtype=np.float32)
    g, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    q = randn(2, 2, 3, 4, seed=23, dtype=np.float32)
    return [
        (F.linear_forward, F.linear_backward, (x, W, g)),
        (F.softmax_forward, F.softmax_backward, (x,)),
        (F.relu_forward, F.relu_backward, (x,)),
        (F.sigmoid_forward, F.sigmoid_backward, (x,)),
        (F.swish_forward, F.swish_backward, (x,)),
        (F.gelu_forward, F.gelu_backward, (x,)),
        (lambda x: F.gelu_forward(x, "none"), F.gelu_backward, (x,)),
        (F.layernorm_forward, F.layernorm_backward, (x, g, b)),
        (lambda x: F.dropout_forward(x, 0.5, rng()), F.dropout_backward, (x,)),
        (F.attention_forward, F.attention_backward, (q, q, q)),
        (F.embedding_forward, F.embedding_backward, (np.array([[0, 3]]), W)),
    ]


@pytest.mark.parametrize("case", range(11))
def test_float32_in_float32_out(case):
    fwd, bwd, args = _float32_cases()[case]
    y, cache = fwd(*args)
    assert y.dtype == np.float32
    grads = bwd(np.ones_like(y), cache)
    for gr in grads if isinstance(grads, tuple) else (grads,):
        assert gr is None or gr.dtype == np.float32


def test_losses_keep_float32_gradients():
    y = randn(3, 4, seed=24, dtype=np.float32)
    assert F.mse_loss(y, np.zeros_like(y))[1].dtype == np.float32
    assert F.cross_entropy(y, np.array([0, 1, 2]))[1].dtype == np.float32


# ---------------------------------------------------------------- numerical stability

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_of_huge_logits(dtype):
    x = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4 + 1, -1e4]], dtype)
    s, _ = F.softmax_forward(x)
    assert np.all(np.isfinite(s))
    np.testing.assert_allclose(s[0], [1, 0, 0], atol=0)
    e = np.exp(np.array([0.0, 1.0, 0.0]))
    np.testing.assert_allclose(s[1], e / e.sum(), rtol=1e-6)


def test_naive_softmax_overflows_where_the_kernel_does_not():
    x = np.array([1e4, 0.0], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp(x) / np.exp(x).sum()
    assert np.isnan(naive[0])
    assert F.softmax_forward(x)[0][0] == 1.0


def test_fully_masked_attention_row_is_zero_not_nan():
    q = k = v = randn(1, 1, 3, 2, seed=25)
    mask = np.array([[False, False, False], [True, False, False], [True, True, True]])
    y, cache = F.attention_forward(q, k, v, mask)
    assert np.all(np.isfinite(y))
    np.testing.assert_array_equal(y[0, 0, 0], 0.0)
    np.testing.assert_array_equal(cache[3][0, 0, 0], 0.0)
    dq, dk, dv = F.attention_backward(randn(1, 1, 3, 2, seed=26), cache)
    assert all(np.all(np.isfinite(g)) for g in (dq, dk, dv))
    np.testing.assert_array_equal(dq[0, 0, 0], 0.0)


def test_masked_keys_get_exactly_zero_gradient():
    q, k, v = randn(2, 1, 4, 3, seed=27), randn(2, 1, 4, 3, seed=28), randn(2, 1, 4, 3, seed=29)
    tokens = np.array([[4, 5, 0, 0], [1, 2, 3, 0]])
    y, cache = F.attention_forward(q, k, v, F.padding_mask(tokens))
    dq, dk, dv = F.attention_backward(randn(2, 1, 4, 3, seed=30), cache)
    pad = tokens == 0
    assert np.all(dk[:, 0][pad] == 0) and np.all(dv[:, 0][pad] == 0)
    assert np.all(cache[3][..., pad[0][None, :].repeat(4, 0)][0] == 0)


def test_finite_mask_fill_leaks_but_minus_inf_does_not():
    """A "large negative" fill is only large relative to the scores: with scores of size 1e4, a
    −1e4 fill leaves the masked key a real share of the probability; −inf (or adding the dtype's
    minimum, which saturates to −inf) gives exactly zero."""
    q = np.array([[[[100.0, 0.0]]]], np.float32)                      # (1, 1, 1, 2)
    k = np.array([[[[-100.0, 0.0], [0.0, 0.0]]]], np.float32)         # key 0 scores −1e4·scale
    v = np.array([[[[0.0], [1.0]]]], np.float32)
    scale = 1.0
    allowed = np.array([[True, False]])                               # key 1 is masked
    additive_small = np.where(allowed, 0.0, -1e4).astype(np.float32)
    _, c_small = F.attention_forward(q, k, v, additive_small, scale)
    _, c_inf = F.attention_forward(q, k, v, allowed, scale)
    _, c_min = F.attention_forward(q, k, v, np.where(allowed, 0.0, np.finfo(np.float32).min)
                                   .astype(np.float32), scale)
    assert c_small[3][0, 0, 0, 1] > 0.4                               # the masked key leaks
    assert c_inf[3][0, 0, 0, 1] == 0.0
    assert c_min[3][0, 0, 0, 1] == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_with_extreme_logits(dtype):
    z = np.array([[1e4, -1e4, 0.0], [-1e4, 1e4, 0.0]], dtype)
    loss_right, dz = F.cross_entropy(z, np.array([0, 1]))
    assert loss_right == 0.0 and np.all(np.isfinite(dz))
    loss_wrong, dz = F.cross_entropy(z, np.array([1, 0]))
    assert loss_wrong == pytest.approx(2e4, rel=1e-6)
    np.testing.assert_allclose(dz, [[0.5, -0.5, 0], [-0.5, 0.5, 0]], atol=1e-6)


def test_cross_entropy_all_ignored_is_zero():
    loss, dz = F.cross_entropy(randn(2, 3, seed=31), np.array([0, 0]), ignore_index=0)
    assert loss == 0.0 and np.all(dz == 0)


def test_sigmoid_does_not_overflow():
    with np.errstate(all="raise"):
        y, _ = F.sigmoid_forward(np.array([-1000.0, 0.0, 1000.0]))
    np.testing.assert_array_equal(y, [0.0, 0.5, 1.0])


def test_causal_mask_with_cache_offset():
    m = F.causal_mask(2, 5)
    np.testing.assert_array_equal(m, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(F.causal_mask(3), np.tril(np.ones((3, 3), bool)))


def test_split_merge_round_trip():
    x = randn(2, 5, 12, seed=32)
    h = F.split_heads(x, 3)
    assert h.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(h[:, 1], x[..., 4:8])
    np.testing.assert_array_equal(F.merge_heads(h), x)


def test_sinusoidal_positions_formula():
    pe = F.sinusoidal_positions(7, 6, np.float64)
    pos, i = 5, 2
    assert pe[pos, 2 * i] == pytest.approx(np.sin(pos / 10000 ** (2 * i / 6)), abs=1e-15)
    assert pe[pos, 2 * i + 1] == pytest.approx(np.cos(pos / 10000 ** (2 * i / 6)), abs=1e-15)


def test_dropout_eval_is_identity_and_train_keeps_expectation():
    x = np.ones((200, 200), np.float32)
    y, _ = F.dropout_forward(x, 0.3, rng(), training=False)
    assert y is x
    y, mask = F.dropout_forward(x, 0.3, rng(), training=True)
    assert abs((y == 0).mean() - 0.3) < 0.01
    assert abs(y.mean() - 1.0) < 0.02


# ---------------------------------------------------------------- bad input

def _raises(exc, match, fn, *args, **kw):
    with pytest.raises(exc, match=match):
        fn(*args, **kw)


def test_bad_input_messages():
    x = randn(2, 3, 4)
    _raises(ValueError, r"x: last axis .* x \(2, 3, 4\), W \(5, 2\)", F.linear_forward, x, randn(5, 2))
    _raises(ValueError, r"b: expected shape \(2,\), got \(3,\)", F.linear_forward, x, randn(4, 2), randn(3))
    _raises(TypeError, r"x: expected dtype float32, float64, float16 or bfloat16, got int64", F.softmax_forward, np.arange(3))
    _raises(TypeError, r"x: expected a NumPy", F.relu_forward, [1.0, 2.0])
    _raises(TypeError, r"dtype mismatch", F.linear_forward, x.astype(np.float32), randn(4, 2))
    _raises(ValueError, r"gamma: expected shape \(4,\), got \(3,\)", F.layernorm_forward, x, randn(3), randn(4))
    _raises(ValueError, r"tokens: expected values in \[0, 5\), got min 0 and max 9",
            F.embedding_forward, np.array([[0, 9]]), randn(5, 3))
    _raises(TypeError, r"tokens: expected an integer NumPy array, got float64",
            F.embedding_forward, np.array([[0.0]]), randn(5, 3))
    _raises(ValueError, r"targets: expected values in \[0, 4\), got min -1 and max 2",
            F.cross_entropy, randn(3, 4), np.array([0, -1, 2]))
    _raises(ValueError, r"targets: expected shape \(3,\)", F.cross_entropy, randn(3, 4), np.array([0, 1]))
    _raises(ValueError, r"k: expected key size D = 4", F.attention_forward,
            randn(1, 2, 3, 4), randn(1, 2, 3, 5), randn(1, 2, 3, 5))
    _raises(ValueError, r"v: expected 3 positions", F.attention_forward,
            randn(1, 2, 3, 4), randn(1, 2, 3, 4), randn(1, 2, 2, 4))
    _raises(ValueError, r"mask: shape \(2, 2\) does not broadcast", F.attention_forward,
            randn(1, 3, 4), randn(1, 3, 4), randn(1, 3, 4), np.ones((2, 2), bool))
    _raises(ValueError, r"target: expected shape \(2, 3, 4\)", F.mse_loss, x, randn(2, 3))
    _raises(ValueError, r"reduction: expected", F.mse_loss, x, x, "avg")
    _raises(ValueError, r"approximate: expected 'tanh' or 'none'", F.gelu_forward, x, "erf")
    _raises(ValueError, r"p: expected a drop probability in \[0, 1\), got 1.5", F.dropout_forward, x, 1.5, rng())
    _raises(TypeError, r"rng: expected np.random.Generator", F.dropout_forward, x, 0.5, 42)
    _raises(ValueError, r"n_heads: must divide C = 4, got 3", F.split_heads, x, 3)
    _raises(ValueError, r"dy: expected shape \(2, 3, 2\)", F.linear_backward, randn(2, 3),
            F.linear_forward(x, randn(4, 2))[1])


def test_nan_is_never_passed_on_silently():
    x = randn(2, 3)
    x[0, 1] = np.nan
    _raises(ValueError, r"x: contains NaN", F.softmax_forward, x)
    _raises(FloatingPointError, r"logits hold inf or NaN", F.cross_entropy, x, np.array([0, 1]))
    _raises(FloatingPointError, r"the loss is not finite", F.mse_loss, x, np.zeros_like(x))


@pytest.mark.parametrize("row", [[np.nan, 1.0, 2.0], [np.nan, -np.inf, -np.inf],
                                 [np.nan, np.nan, np.nan], [np.nan, np.inf, 0.0]])
def test_softmax_refuses_nan_in_any_row_with_the_row_maximum_by_fmax(row):
    # fmax skips NaN: a NaN beside finite, masked (−inf) or +inf entries, or a row of NaN
    # only, must still raise, in float64, float32 and through the float32 path of float16
    for dtype in (np.float64, np.float32, np.float16):
        x = np.zeros((3, 3), dtype)
        x[1] = row
        with pytest.raises(ValueError, match=r"x: contains NaN or \+inf"):
            F.softmax_forward(x)
