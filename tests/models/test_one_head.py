"""OneHeadLM, the first chapter's model: its gradients three ways and its input checks.

Finite differences in float64 with a random upstream gradient (and through the loss), PyTorch's
autograd in float64 for the loss and every parameter gradient, causality, decoding, and bad input
that names ``tokens``.
"""
import numpy as np
import pytest

import tformer.nn.functional as F
from tformer.decoding.generate import sample
from tformer.core.gradcheck import check_module
from tformer.models import OneHeadLM

V, C, T_MAX = 13, 8, 6


def _model(seed=0):
    """A float64 model whose weights are large enough that attention is far from uniform."""
    model = OneHeadLM(d_model=C, max_len=T_MAX, vocab_size=V, seed=seed, dtype=np.float64)
    for _, p, _ in model.named_parameters():
        p *= 25.0                                     # N(0, 0.5²) instead of N(0, 0.02²)
    model.lm_head.b[...] = np.random.default_rng([seed, 1]).standard_normal(V)
    return model


def _tokens(B=3, T=5, seed=0):
    return np.random.default_rng([seed, 2]).integers(0, V, (B, T))


@pytest.mark.parametrize("seed", [0, 1])
def test_gradients_match_finite_differences_with_a_random_upstream_gradient(seed):
    model = _model(seed)
    errors = check_module(model, _tokens(seed=seed), seed=seed, check_input=False)
    assert set(errors) == {"wte.W", "wpe.W", "q.W", "k.W", "v.W", "lm_head.W", "lm_head.b"}
    assert max(errors.values()) < 1e-7, errors
    assert model.att.std() > 0.05                     # the head attends unevenly: a real test


def test_gradients_match_finite_differences_through_the_loss():
    model, tokens = _model(), _tokens()
    targets = np.roll(tokens, -1, axis=1)
    errors = check_module(model, tokens, check_input=False,
                          loss=lambda logits: F.cross_entropy(logits, targets))
    assert max(errors.values()) < 1e-7, errors


def _torch_loss(torch, params, tokens, targets):
    """The same model written with PyTorch operations, for autograd."""
    tok = torch.as_tensor(tokens)
    T = tok.shape[1]
    x = params["wte.W"][tok] + params["wpe.W"][:T]                          # (B, T, C)
    q, k, v = x @ params["q.W"], x @ params["k.W"], x @ params["v.W"]
    scores = q @ k.transpose(-1, -2) / C ** 0.5                             # (B, T, T)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    att = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    logits = (x + att @ v) @ params["lm_head.W"] + params["lm_head.b"]      # (B, T, V)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V),
                                             torch.as_tensor(targets).reshape(-1))


def test_loss_and_every_gradient_match_pytorch(torch):
    model, tokens = _model(), _tokens(B=4, T=T_MAX)
    targets = np.random.default_rng(3).integers(0, V, tokens.shape)
    loss, dlogits = F.cross_entropy(model.forward(tokens), targets)
    model.zero_grad()
    model.backward(dlogits)
    params = {name: torch.tensor(p, requires_grad=True) for name, p, _ in model.named_parameters()}
    ref = _torch_loss(torch, params, tokens, targets)
    ref.backward()
    assert abs(loss - ref.item()) < 1e-12
    for name, _, grad in model.named_parameters():
        np.testing.assert_allclose(grad, params[name].grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=name)


def test_a_position_never_sees_the_future():
    model, tokens = _model(), _tokens(B=1, T=T_MAX)
    before = model.forward(tokens).copy()
    changed = tokens.copy()
    changed[0, 3] = (changed[0, 3] + 1) % V
    after = model.forward(changed)
    np.testing.assert_array_equal(after[:, :3], before[:, :3])
    assert not np.allclose(after[:, 3:], before[:, 3:])
    assert np.allclose(np.triu(model.att[0], k=1), 0.0)


def test_first_loss_is_near_ln_vocab_and_sampling_gives_bytes():
    model = OneHeadLM(d_model=16, max_len=8, seed=0)
    tokens = np.random.default_rng(0).integers(0, 256, (4, 8))
    loss, _ = F.cross_entropy(model.forward(tokens), tokens)
    assert abs(loss - np.log(256)) < 0.1
    out = sample(model, tokens[:1, :3], 20, seed=0)              # past max_len: the last 8 fed
    assert out.shape == (1, 23) and out.min() >= 0 and out.max() < 256
    np.testing.assert_array_equal(out, sample(model, tokens[:1, :3], 20, seed=0))


@pytest.mark.parametrize("tokens, kind, message", [
    (np.array([[0, V]]), ValueError, r"tokens: expected values in \[0, 13\)"),
    (np.array([[-1, 2]]), ValueError, r"tokens: expected values in \[0, 13\)"),
    (np.zeros((1, T_MAX + 1), np.int64), ValueError, r"tokens: 7 positions exceed max_len = 6"),
    (np.zeros((1, 0), np.int64), ValueError, r"tokens: expected at least one sequence"),
    (np.zeros(4, np.int64), ValueError, r"tokens: expected 2 dimensions"),
    (np.zeros((1, 2)), TypeError, r"tokens: expected an integer NumPy array"),
])
def test_bad_tokens_are_named(tokens, kind, message):
    with pytest.raises(kind, match=message):
        _model().forward(tokens)


def test_backward_needs_a_forward_and_the_logits_shape():
    model = _model()
    with pytest.raises(RuntimeError, match="forward"):
        model.backward(np.zeros((1, 2, V)))
    model.forward(_tokens(B=1, T=2))
    with pytest.raises(ValueError, match="dlogits: expected shape"):
        model.backward(np.zeros((1, 3, V)))
