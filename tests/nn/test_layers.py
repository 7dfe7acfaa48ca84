"""Modules and blocks: gradients against finite differences, the Module contract, gradcheck itself,
checkpoints and the training loop's guards."""
import os

import numpy as np
import pytest

import tformer.nn.functional as F
from tformer.nn.attention import MultiHeadAttention
from tformer.nn.blocks import PostNormBlock, PreNormBlock, ResidualBlock
from tformer.training.checkpoint import load_checkpoint, save_checkpoint
from tformer.core.gradcheck import check_kernel, check_module
from tformer.nn.layers import Embedding, FeedForward, LayerNorm, Linear, Module, SinusoidalPositions
from tformer.training.optim import AdamW
from tformer.training.train import NonFiniteLossError, train

TOL = 1e-6
f64 = np.float64


def x_in(seed=0, shape=(2, 5, 8)):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("make", [
    lambda: Linear(8, 6, dtype=f64),
    lambda: Linear(8, 6, bias=False, dtype=f64),
    lambda: LayerNorm(8, dtype=f64),
    lambda: FeedForward(8, 16, "relu", dtype=f64),
    lambda: FeedForward(8, 16, "swish", bias=False, dtype=f64),
    lambda: FeedForward(8, 16, "gelu", dtype=f64),
    lambda: MultiHeadAttention(8, 1, bias=False, dtype=f64),
    lambda: MultiHeadAttention(8, 2, bias=True, dtype=f64),
    lambda: MultiHeadAttention(8, 4, fused_qkv=True, causal=True, dtype=f64),
    lambda: ResidualBlock(8, 1, 16, dtype=f64),
    lambda: PostNormBlock(8, 2, 16, dtype=f64),
    lambda: PostNormBlock(8, 2, 16, causal=True, dtype=f64),
    lambda: PreNormBlock(8, 2, 16, dtype=f64),
    lambda: SinusoidalPositions(10, 8, dtype=f64),
])
def test_module_gradients(make):
    errors = check_module(make(), x_in())
    assert max(errors.values()) < TOL, errors


def test_attention_module_with_padding_mask_gradients():
    m = MultiHeadAttention(8, 2, dtype=f64)
    mask = F.padding_mask(np.array([[1, 2, 3, 0, 0], [4, 5, 6, 7, 0]]))
    x = x_in()

    class Masked(Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x, mask)

        def backward(self, dy):
            return self.m.backward(dy)

    assert max(check_module(Masked(), x).values()) < TOL


def test_embedding_module_gradient():
    tokens = np.array([[0, 2, 2, 5]])
    errors = check_module(Embedding(6, 4, dtype=f64), tokens)
    assert max(errors.values()) < TOL


def test_gradcheck_catches_a_wrong_backward():
    def bad_backward(ds, cache):
        s, _ = cache
        return s * ds                       # forgets the −⟨g, s⟩ term
    err = check_kernel(F.softmax_forward, bad_backward, [x_in()])
    assert err > 1e-2


def test_backward_accumulates_and_zero_grad_clears():
    lin = Linear(8, 3, dtype=f64)
    x, g = x_in(), x_in(1, (2, 5, 3))
    lin.forward(x)
    lin.backward(g)
    once = lin.grads["W"].copy()
    lin.forward(x)
    lin.backward(g)
    np.testing.assert_allclose(lin.grads["W"], 2 * once)
    lin.zero_grad()
    assert not lin.grads["W"].any()


def test_named_parameters_state_dict_and_modes():
    blk = PostNormBlock(8, 2, 16, dropout=0.5)
    names = [n for n, _, _ in blk.named_parameters()]
    assert "attn.q.W" in names and "ffn.fc2.b" in names and "ln2.gamma" in names
    assert blk.num_parameters() == 4 * (8 * 8 + 8) + (8 * 16 + 16) + (16 * 8 + 8) + 4 * 8
    sd = blk.state_dict()
    other = PostNormBlock(8, 2, 16, seed=1).load_state_dict(sd)
    for (n, p, _), (_, q, _) in zip(blk.named_parameters(), other.named_parameters()):
        np.testing.assert_array_equal(p, q)
    blk.eval()
    assert not blk.drop1.training
    x = x_in().astype(np.float32)
    np.testing.assert_array_equal(blk(x), blk(x))          # deterministic in eval
    blk.train()
    assert blk.drop2.training and not np.array_equal(blk(x), blk(x))
    with pytest.raises(ValueError, match=r"state\['attn.q.W'\]: expected shape \(8, 8\)"):
        blk.load_state_dict({**sd, "attn.q.W": np.zeros((3, 3))})
    with pytest.raises(ValueError, match="missing keys \\['ln2.beta'\\]"):
        blk.load_state_dict({k: v for k, v in sd.items() if k != "ln2.beta"})


def test_kv_cache_matches_full_forward():
    m = MultiHeadAttention(8, 2, fused_qkv=True, causal=True, dtype=f64)
    x = x_in()
    full = m(x)
    cache = m.new_cache(2, 5)
    steps = [m.forward(x[:, :2], kv_cache=cache)] + [m.forward(x[:, t:t + 1], kv_cache=cache)
                                                     for t in range(2, 5)]
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-13)


def test_bad_module_input():
    with pytest.raises(ValueError, match="n_heads: must divide d_model = 8, got 3"):
        MultiHeadAttention(8, 3)
    with pytest.raises(ValueError, match=r"x: expected last axis d_model = 8, got shape \(2, 5, 6\)"):
        MultiHeadAttention(8, 2)(np.zeros((2, 5, 6), np.float32))
    with pytest.raises(ValueError, match="x: 12 positions exceed max_len = 10"):
        SinusoidalPositions(10, 8)(np.zeros((1, 12, 8), np.float32))


# ---------------------------------------------------------------- checkpoints and the loop

class Regressor(Module):
    """y = x W: the smallest model that trains, for the loop's tests."""

    def __init__(self, seed=0):
        super().__init__()
        self.config = {"d": 3}
        self.lin = Linear(3, 1, bias=False, seed=seed, dtype=f64)

    def forward(self, x):
        return self.lin(x)

    def backward(self, dy):
        return self.lin.backward(dy)


def reg_batch(i):
    r = np.random.default_rng([7, i])
    x = r.standard_normal((16, 3))
    return x, x @ np.array([[1.0], [-2.0], [0.5]])


def reg_loss(model, batch):
    x, y = batch
    return F.mse_loss(model.forward(x), y)


def test_checkpoint_round_trip_and_config_mismatch(tmp_path):
    model = Regressor()
    opt = AdamW(model, lr=0.1)
    train(model, opt, reg_batch, reg_loss, 3, progress_bar=False)
    path = tmp_path / "ck.npz"
    save_checkpoint(path, model, opt, step=3)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
    fresh = Regressor(seed=5)
    fresh_opt = AdamW(fresh, lr=0.1)
    meta = load_checkpoint(path, fresh, fresh_opt)
    assert meta["step"] == 3 and fresh_opt.t == 3
    np.testing.assert_array_equal(fresh.lin.W, model.lin.W)
    other = Regressor()
    other.config = {"d": 4}
    with pytest.raises(ValueError, match="another configuration .*d: checkpoint 3 vs model 4"):
        load_checkpoint(path, other)


def test_training_reduces_the_loss_and_resume_is_exact(tmp_path):
    a = Regressor()
    oa = AdamW(a, lr=0.05, weight_decay=0.0)
    ha = train(a, oa, reg_batch, reg_loss, 40, progress_bar=False)
    assert ha["loss"][-1] < 0.1 * ha["loss"][0]
    b = Regressor()
    ob = AdamW(b, lr=0.05, weight_decay=0.0)
    path = tmp_path / "b.npz"
    train(b, ob, reg_batch, reg_loss, 20, checkpoint_path=path, progress_bar=False)
    c = Regressor(seed=3)
    oc = AdamW(c, lr=0.05, weight_decay=0.0)
    step = load_checkpoint(path, c, oc)["step"]
    train(c, oc, reg_batch, reg_loss, 40, start_step=step, progress_bar=False)
    np.testing.assert_array_equal(c.lin.W, a.lin.W)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    model = Regressor()
    opt = AdamW(model, lr=0.05)
    path = tmp_path / "nan.npz"

    def batch(i):
        x, y = reg_batch(i)
        return (x * np.inf, y) if i >= 5 else (x, y)

    with pytest.raises(NonFiniteLossError, match=r"step 6: .* last good checkpoint is .*nan.npz"):
        with np.errstate(invalid="ignore"):
            train(model, opt, batch, reg_loss, 10, checkpoint_path=path, checkpoint_every=1,
                  progress_bar=False)
    assert load_checkpoint(path, Regressor())["step"] == 5
    assert np.all(np.isfinite(model.lin.W))
