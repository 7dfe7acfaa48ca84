"""Every kernel against PyTorch in float64: the same values and the same gradients (skipped without torch)."""
import numpy as np
import pytest

import tformer.functional as F

torch = pytest.importorskip("torch")
tF = torch.nn.functional


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def t(a, grad=True):
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


def close(a, b, tol=1e-12):
    np.testing.assert_allclose(np.asarray(a), b.detach().numpy(), rtol=tol, atol=tol)


def run_torch(fn, arrays, g):
    ts = [t(a) for a in arrays]
    y = fn(*ts)
    y.backward(torch.tensor(g))
    return y, [x.grad for x in ts]


@pytest.mark.parametrize("name,torch_fn,kw", [
    ("relu", tF.relu, {}),
    ("sigmoid", torch.sigmoid, {}),
    ("swish", tF.silu, {}),
    ("gelu", lambda x: tF.gelu(x, approximate="tanh"), {"approximate": "tanh"}),
    ("gelu", lambda x: tF.gelu(x, approximate="none"), {"approximate": "none"}),
    ("softmax", lambda x: torch.softmax(x, -1), {}),
])
def test_elementwise_and_softmax(name, torch_fn, kw):
    x, g = randn(3, 4, 5, seed=1), randn(3, 4, 5, seed=2)
    y, cache = getattr(F, f"{name}_forward")(x, **kw)
    dx = getattr(F, f"{name}_backward")(g, cache)
    ty, (tdx,) = run_torch(torch_fn, [x], g)
    close(y, ty)
    close(dx, tdx)


def test_linear():
    x, W, b, g = randn(2, 3, 4, seed=3), randn(4, 5, seed=4), randn(5, seed=5), randn(2, 3, 5, seed=6)
    y, cache = F.linear_forward(x, W, b)
    grads = F.linear_backward(g, cache)
    ty, tgrads = run_torch(lambda x, W, b: tF.linear(x, W.T, b), [x, W, b], g)
    close(y, ty)
    for a, b_ in zip(grads, tgrads):
        close(a, b_)


def test_embedding():
    tokens = np.array([[1, 3, 1], [0, 3, 3]])
    W, g = randn(5, 4, seed=7), randn(2, 3, 4, seed=8)
    y, cache = F.embedding_forward(tokens, W)
    dW = F.embedding_backward(g, cache)
    ty, (tdW,) = run_torch(lambda W: tF.embedding(torch.tensor(tokens), W), [W], g)
    close(y, ty)
    close(dW, tdW)


def test_layernorm():
    x, gam, bet, g = randn(2, 3, 6, seed=9), randn(6, seed=10), randn(6, seed=11), randn(2, 3, 6, seed=12)
    y, cache = F.layernorm_forward(x, gam, bet, 1e-5)
    grads = F.layernorm_backward(g, cache)
    ty, tgrads = run_torch(lambda x, a, b: tF.layer_norm(x, (6,), a, b, 1e-5), [x, gam, bet], g)
    close(y, ty)
    for a, b_ in zip(grads, tgrads):
        close(a, b_, 1e-11)


@pytest.mark.parametrize("mask_kind", [None, "causal", "padding"])
def test_attention(mask_kind):
    q, k, v = randn(2, 3, 4, 5, seed=13), randn(2, 3, 4, 5, seed=14), randn(2, 3, 4, 6, seed=15)
    g = randn(2, 3, 4, 6, seed=16)
    mask = {None: None, "causal": F.causal_mask(4),
            "padding": F.padding_mask(np.array([[5, 2, 0, 0], [1, 1, 1, 0]]))}[mask_kind]
    y, cache = F.attention_forward(q, k, v, mask)
    grads = F.attention_backward(g, cache)
    tmask = None if mask is None else torch.tensor(mask)
    ty, tgrads = run_torch(lambda q, k, v: tF.scaled_dot_product_attention(q, k, v, attn_mask=tmask),
                           [q, k, v], g)
    close(y, ty)
    for a, b_ in zip(grads, tgrads):
        close(a, b_)


def test_mse_mean():
    y, target = randn(2, 3, 4, seed=17), randn(2, 3, 4, seed=18)
    loss, dy = F.mse_loss(y, target, "mean")
    ty = t(y)
    tl = tF.mse_loss(ty, torch.tensor(target))
    tl.backward()
    assert loss == pytest.approx(tl.item(), rel=1e-13)
    close(dy, ty.grad)


def test_cross_entropy_with_ignore_index():
    z = randn(2, 5, 7, seed=19)
    targets = np.array([[0, 3, 6, 0, 2], [1, 0, 0, 4, 5]])
    loss, dz = F.cross_entropy(z, targets, ignore_index=0)
    tz = t(z)
    tl = tF.cross_entropy(tz.reshape(-1, 7), torch.tensor(targets).reshape(-1), ignore_index=0)
    tl.backward()
    assert loss == pytest.approx(tl.item(), rel=1e-13)
    close(dz, tz.grad)
