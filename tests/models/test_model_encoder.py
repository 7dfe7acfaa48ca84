"""The post-LN encoder (tformer/models/encoder.py), its reconstruction data, its training run and
its CLI.

Oracles: float64 central differences for every parameter (and the input), the sinusoidal formula
written out with ``math.sin`` / ``math.cos``, the split/merge reshapes as exact permutations, and
PyTorch's ``nn.TransformerEncoderLayer`` (post-LN, ReLU) in float64 when torch is installed.
The last section checks the claims of the encoder chapter's "What the published code computes": the
published script's weight gradient is rejected by a gradient check, and a tensor whose gradient is always 0
never moves under Adam.
"""
import json
import math

import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.__main__ import main as cli_main
from tformer.nn.blocks import PostNormBlock
from tformer.data.reconstruction import (ReconstructionData, forward_loss, mse, per_token_error,
                                         standardize_rows)
from tformer.core.gradcheck import check_kernel, check_module
from tformer.nn.layers import SinusoidalPositions
from tformer.models.encoder import Encoder
from tformer.training.optim import Adam
from tformer.runs.encoder import HEADLINE_MSE, run


def tiny(dtype=np.float64, seed=0, **kw):
    cfg = dict(d_model=8, n_heads=2, n_layers=2, d_ff=12, max_len=8)
    cfg.update(kw)
    return Encoder(seed=seed, dtype=dtype, **cfg)


def inputs(B=2, T=5, d=8, seed=1):
    return np.random.default_rng(seed).standard_normal((B, T, d))


# ---------------------------------------------------------------- gradients

def test_every_parameter_gradient_with_the_reconstruction_loss():
    """The reconstruction loss L = ‖Ŷ − X‖²/(BTd) with target X, through both blocks, LayerNorm included."""
    model, x = tiny(), inputs()
    target = x.copy()
    errs = check_module(model, x, loss=lambda y: F.mse_loss(y, target), seed=3)
    names = {n for n, _, _ in model.named_parameters()}
    assert set(errs) == names | {"input"}
    assert len(names) == 2 * 16                      # per block: q, k, v, o, fc1, fc2 (W, b) + 2 LNs
    assert max(errs.values()) < 1e-6, {k: v for k, v in errs.items() if v >= 1e-6}


@pytest.mark.parametrize("n_layers,n_heads", [(1, 1), (3, 4)])
def test_every_parameter_gradient_random_upstream(n_layers, n_heads):
    model = tiny(n_layers=n_layers, n_heads=n_heads, seed=n_layers)
    x = inputs(B=2, T=4, seed=n_layers + 10)
    errs = check_module(model, x, seed=n_layers, max_entries=24)    # 24 random entries per tensor
    assert len(errs) == 16 * n_layers + 1
    assert max(errs.values()) < 1e-6, {k: v for k, v in errs.items() if v >= 1e-6}


def test_key_bias_gradient_is_zero():
    """softmax ignores a shift shared by all keys: q·(k_j + b^K) = q·k_j + q·b^K, so ∂L/∂b^K = 0."""
    model, x = tiny(), inputs()
    y = model.forward(x)
    model.zero_grad()
    model.backward(np.random.default_rng(0).standard_normal(y.shape))
    top = max(np.abs(g).max() for _, _, g in model.named_parameters())
    for name, _, g in model.named_parameters():
        if name.endswith("attn.k.b"):
            assert np.abs(g).max() < 1e-12 * top, name
        else:
            assert np.abs(g).max() > 1e-6 * top, name


def test_loss_gradient_is_two_over_BTd():
    rng = np.random.default_rng(0)
    y, x = rng.standard_normal((3, 4, 8)), rng.standard_normal((3, 4, 8))
    loss, dy = F.mse_loss(y, x)
    assert abs(loss - np.mean((y - x) ** 2)) < 1e-12
    np.testing.assert_allclose(dy, 2.0 / (3 * 4 * 8) * (y - x), rtol=1e-12, atol=0)


def test_backward_accumulates_and_returns_dx():
    model, x = tiny(), inputs()
    g = np.random.default_rng(5).standard_normal(x.shape)
    model.forward(x)
    model.zero_grad()
    dx1 = model.backward(g)
    first = {n: gr.copy() for n, _, gr in model.named_parameters()}
    model.forward(x)
    dx2 = model.backward(g)
    np.testing.assert_allclose(dx1, dx2, rtol=1e-12, atol=1e-14)
    for n, _, gr in model.named_parameters():
        np.testing.assert_allclose(gr, 2 * first[n], rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- multi-head split and merge

def test_split_merge_round_trip_and_layout():
    rng = np.random.default_rng(0)
    B, T, C, H = 2, 5, 12, 3
    x = rng.standard_normal((B, T, C))
    s = F.split_heads(x, H)
    assert s.shape == (B, H, T, C // H)
    for h in range(H):                                  # head h owns channels [h·D, (h+1)·D)
        np.testing.assert_array_equal(s[:, h], x[:, :, h * 4:(h + 1) * 4])
    np.testing.assert_array_equal(F.merge_heads(s), x)  # exact: a reshape, no arithmetic
    y = rng.standard_normal((B, H, T, C // H))
    np.testing.assert_array_equal(F.split_heads(F.merge_heads(y), H), y)


def test_split_and_merge_are_each_others_gradient():
    """split is a permutation P of the entries, so its VJP is Pᵀ = P⁻¹ = merge.

    Equivalently ⟨split(x), g⟩ = ⟨x, merge(g)⟩ for every x and g (and the same for merge).
    """
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 8))
    g = rng.standard_normal((2, 4, 3, 2))
    assert abs(np.vdot(F.split_heads(x, 4), g) - np.vdot(x, F.merge_heads(g))) < 1e-12
    y = rng.standard_normal((2, 4, 3, 2))
    gy = rng.standard_normal((2, 3, 8))
    assert abs(np.vdot(F.merge_heads(y), gy) - np.vdot(y, F.split_heads(gy, 4))) < 1e-12


# ---------------------------------------------------------------- sinusoidal positions

def test_sinusoidal_values_against_the_formula():
    T, C = 7, 10
    want = np.empty((T, C))
    for pos in range(T):
        for i in range(C // 2):
            want[pos, 2 * i] = math.sin(pos / 10000 ** (2 * i / C))
            want[pos, 2 * i + 1] = math.cos(pos / 10000 ** (2 * i / C))
    np.testing.assert_allclose(F.sinusoidal_positions(T, C, np.float64), want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(SinusoidalPositions(T, C, np.float64).pe, want, rtol=0, atol=1e-15)
    assert abs(want[0, 0]) == 0.0 and want[0, 1] == 1.0          # PE(0) = (0, 1, 0, 1, …)
    np.testing.assert_allclose((want ** 2).sum(axis=1), C / 2, rtol=1e-14)   # sin² + cos² = 1 per pair


def test_encoder_adds_the_table_and_ends_with_the_last_block():
    """Ŷ = O of the last block (no final LayerNorm), applied to X + PE[:T]."""
    model, x = tiny(), inputs()
    pe = F.sinusoidal_positions(8, 8, np.float64)
    np.testing.assert_allclose(model.pos(x) - x, np.broadcast_to(pe[:5], x.shape), atol=1e-15)
    h = x + pe[:5]
    for block in model.blocks:
        h = block.forward(h)
    np.testing.assert_array_equal(model.forward(x), h)
    assert isinstance(model.blocks[0], PostNormBlock)
    assert model.blocks[0].ffn.act.name == "relu" and model.blocks[0].attn.q.b is not None


def test_positions_have_no_parameters_and_identity_backward():
    pos = SinusoidalPositions(6, 4, np.float64)
    assert pos.num_parameters() == 0
    g = np.random.default_rng(0).standard_normal((2, 6, 4))
    np.testing.assert_array_equal(pos.backward(g), g)


# ---------------------------------------------------------------- PyTorch parity

@pytest.mark.torch_parity
def test_matches_torch_post_ln_encoder_layers():
    torch = pytest.importorskip("torch")
    model, x = tiny(n_layers=2, n_heads=2), inputs(B=2, T=5)
    layers = []
    for blk in model.blocks:
        L = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=12, dropout=0.0, activation="relu",
                                             batch_first=True, norm_first=False, dtype=torch.float64)
        a = blk.attn
        with torch.no_grad():
            L.self_attn.in_proj_weight.copy_(torch.tensor(np.concatenate([a.q.W.T, a.k.W.T, a.v.W.T])))
            L.self_attn.in_proj_bias.copy_(torch.tensor(np.concatenate([a.q.b, a.k.b, a.v.b])))
            L.self_attn.out_proj.weight.copy_(torch.tensor(a.o.W.T))
            L.self_attn.out_proj.bias.copy_(torch.tensor(a.o.b))
            L.linear1.weight.copy_(torch.tensor(blk.ffn.fc1.W.T))
            L.linear1.bias.copy_(torch.tensor(blk.ffn.fc1.b))
            L.linear2.weight.copy_(torch.tensor(blk.ffn.fc2.W.T))
            L.linear2.bias.copy_(torch.tensor(blk.ffn.fc2.b))
        layers.append(L.train())
    tx = torch.tensor(x, requires_grad=True)
    h = tx + torch.tensor(F.sinusoidal_positions(5, 8, np.float64))
    for L in layers:
        h = L(h)
    tl = torch.mean((h - torch.tensor(x)) ** 2)
    tl.backward()
    y = model.forward(x)
    loss, dy = F.mse_loss(y, x)
    model.zero_grad()
    dx = model.backward(dy)
    np.testing.assert_allclose(y, h.detach().numpy(), rtol=0, atol=1e-12)
    assert abs(loss - tl.item()) < 1e-12
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=0, atol=1e-12)
    blk, L = model.blocks[0], layers[0]
    W_q_grad = L.self_attn.in_proj_weight.grad[:8].numpy().T          # rows 0..7 of in_proj are W_q
    np.testing.assert_allclose(blk.attn.q.grads["W"], W_q_grad, atol=1e-12)
    np.testing.assert_allclose(blk.ffn.fc1.grads["W"], L.linear1.weight.grad.numpy().T, atol=1e-12)
    np.testing.assert_allclose(blk.ln1.grads["gamma"], L.norm1.weight.grad.numpy(), atol=1e-12)
    np.testing.assert_allclose(blk.ln2.grads["beta"], L.norm2.bias.grad.numpy(), atol=1e-12)


# ---------------------------------------------------------------- model API and bad input

def test_attention_maps_are_distributions():
    model = tiny(n_heads=2)
    model.forward(inputs(B=3, T=6))
    maps = model.attention_maps()
    assert len(maps) == 2 and all(m.shape == (3, 2, 6, 6) for m in maps)
    for m in maps:
        np.testing.assert_allclose(m.sum(axis=-1), 1.0, rtol=1e-12)
        assert (m >= 0).all()


def test_config_dtype_and_state_round_trip():
    model = Encoder()
    assert model.num_parameters() == 99_968          # 2·(4·(64²+64) + 64·256+256 + 256·64+64 + 4·64)
    assert model.blocks[0].attn.q.W.dtype == np.float32
    assert json.loads(json.dumps(model.config)) == model.config
    other = Encoder(seed=1)
    other.load_state_dict(model.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)
    np.testing.assert_array_equal(other.forward(x), model.forward(x))


@pytest.mark.parametrize("kw,err", [
    (dict(n_heads=3), ValueError), (dict(d_model=7, n_heads=1), ValueError),
    (dict(n_layers=0), ValueError), (dict(d_ff=0), ValueError),
])
def test_bad_configuration_is_rejected(kw, err):
    with pytest.raises(err):
        tiny(**kw)


def test_bad_input_is_rejected():
    model = tiny()
    with pytest.raises(ValueError, match="d_model"):
        model.forward(np.zeros((2, 3, 6)))
    with pytest.raises(ValueError, match="max_len"):
        model.forward(np.zeros((2, 9, 8)))
    with pytest.raises(ValueError, match="dimensions"):
        model.forward(np.zeros((3, 8)))
    with pytest.raises(TypeError, match="float32"):
        model.forward(np.zeros((2, 3, 8), np.float32))
    with pytest.raises(TypeError):
        model.forward(np.zeros((2, 3, 8), np.int64))


# ---------------------------------------------------------------- data

def test_data_is_fixed_standardised_and_reachable():
    a, b = ReconstructionData(seed=4), ReconstructionData(seed=4)
    np.testing.assert_array_equal(a.train, b.train)
    np.testing.assert_array_equal(a.test, b.test)
    assert a.train.shape == (256, 16, 64) and a.test.shape == (64, 16, 64) and a.train.dtype == np.float32
    np.testing.assert_allclose(a.table.mean(axis=1), 0.0, atol=1e-6)
    np.testing.assert_allclose(a.table.var(axis=1), 1.0, rtol=1e-5)
    # the last LayerNorm (γ = 1, β = 0, ε → 0) reproduces a standardised token exactly
    y, _ = F.layernorm_forward(a.train.astype(np.float64), np.ones(64), np.zeros(64), eps=1e-12)
    np.testing.assert_allclose(y, a.train, atol=1e-5)
    assert not np.array_equal(ReconstructionData(seed=5).train, a.train)


def test_an_epoch_is_one_shuffled_pass():
    d = ReconstructionData(n_train=70, batch_size=32, seed=0)
    assert d.steps_per_epoch == 3
    for epoch in range(2):
        got = np.concatenate([d.batch(epoch * 3 + j) for j in range(3)])
        assert got.shape == (70, 16, 64)
        np.testing.assert_array_equal(got, d.train[d.epoch_order(epoch)])
    assert d.batch(2).shape[0] == 6                                # the last batch holds the rest
    np.testing.assert_array_equal(d.batch(4), d.batch(4))          # a pure function of the index
    assert not np.array_equal(d.epoch_order(0), d.epoch_order(1))


def test_standardize_rows():
    a = standardize_rows(np.random.default_rng(0).normal(3.0, 5.0, (4, 10)))
    np.testing.assert_allclose(a.mean(axis=1), 0, atol=1e-12)
    np.testing.assert_allclose(a.var(axis=1), 1, rtol=1e-12)


@pytest.mark.parametrize("kw", [dict(n_train=0), dict(batch_size=0), dict(d_model=1), dict(seq_len=2.5)])
def test_bad_data_arguments(kw):
    with pytest.raises(ValueError):
        ReconstructionData(**kw)


def test_batch_index_must_be_non_negative():
    with pytest.raises(ValueError, match="i:"):
        ReconstructionData(n_train=8).batch(-1)


def test_mse_helpers_agree_with_the_loss():
    d = ReconstructionData(n_train=40, n_test=8, d_model=8, seq_len=5, vocab_size=7, dtype=np.float64)
    model = tiny()
    loss, _ = forward_loss(model, d.train)
    assert abs(mse(model, d.train, batch_size=16) - loss) < 1e-12
    err = per_token_error(model, d.train)
    assert err.shape == (40, 5)
    assert abs((err ** 2).sum() / d.train.size - loss) < 1e-12


# ---------------------------------------------------------------- training and the CLI

def test_short_training_run_decreases_the_mse():
    r = run(layers=1, d_model=16, heads=2, d_ff=32, epochs=6, lr=3e-3, batch_size=16, n_train=32,
            n_test=8, seq_len=6, vocab_size=9, progress_bar=False)
    assert r["epochs"] == [1, 2, 3, 4, 5, 6]
    assert r["train_mse"][-1] < 0.5 * r["train_mse"][0]
    assert r["final_mse"] == r["train_mse"][-1] and r["final_test_mse"] == r["test_mse"][-1]
    assert len(r["history"]["loss"]) == 6 * 2
    assert r["target"] == HEADLINE_MSE == 0.0043


def test_crossing_epoch_is_the_first_below_target():
    r = run(layers=1, d_model=16, heads=2, d_ff=32, epochs=4, lr=3e-3, batch_size=16, n_train=32,
            n_test=8, seq_len=6, vocab_size=9, progress_bar=False, target=10.0)
    assert r["crossed"] == 1                           # every MSE is below 10
    r = run(layers=1, d_model=16, heads=2, d_ff=32, epochs=2, lr=3e-3, batch_size=16, n_train=32,
            n_test=8, seq_len=6, vocab_size=9, progress_bar=False, target=0.0)
    assert r["crossed"] is None


def test_cli_prints_the_final_mse_and_crossing(capsys):
    rc = cli_main(["run", "encoder", "--steps", "2", "--n-train", "32", "--n-test", "8", "--n-layers", "1",
                   "--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--seq-len", "6", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "final MSE (training set, after epoch 2)" in out
    assert "held-out MSE" in out and "wall time" in out
    assert "never reached 0.0043" in out or "first <= 0.0043" in out


# ---------------------------------------------------------------- the published script's defects

OUTPUT_LN = "blocks.1.ln2."


def _published_weight_grad(dy, cache):
    """The weight gradient of the encoder's published script, as a NEGATIVE example: xᵀ of shape
    (B, d_in, T) reshaped straight to (d_in, B·T), then divided by B. dx and db are tformer's."""
    x, W, _ = cache
    B, T, d_in = x.shape
    dW = x.transpose(0, 2, 1).reshape(d_in, B * T) @ dy.reshape(B * T, -1) / B
    dx, _, db = F.linear_backward(dy, cache)
    return dx, dW, db


def _linear_case(B, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, 4, 5)), rng.standard_normal((5, 6)), rng.standard_normal(6)]


def test_linear_weight_grad_sums_over_every_token_of_every_sequence():
    """dW = Σ_b x_bᵀ dy_b; the published reshape is another matrix for B > 1, not a multiple of it."""
    x, W, b = _linear_case(4, 20)
    y, cache = F.linear_forward(x, W, b)
    dy = np.random.default_rng(21).standard_normal(y.shape)
    dW = F.linear_backward(dy, cache)[1]
    assert np.allclose(dW, sum(x[i].T @ dy[i] for i in range(4)), rtol=1e-12, atol=1e-12)
    published = _published_weight_grad(dy, cache)[1] * 4                  # undo the division by B
    cos = np.vdot(published, dW) / (np.linalg.norm(published) * np.linalg.norm(dW))
    assert abs(cos) < 0.9 and not np.allclose(published, dW)


@pytest.mark.parametrize("B", [2, 3, 8])
def test_gradcheck_rejects_the_published_weight_gradient(B):
    inputs = _linear_case(B, B)
    assert check_kernel(F.linear_forward, _published_weight_grad, inputs, wrt=[1]) > 0.5
    assert check_kernel(F.linear_forward, F.linear_backward, inputs, wrt=[1]) < 1e-7


def test_the_published_weight_gradient_passes_with_one_sequence():
    """For B = 1 the reshape is the right matrix: a test with one sequence cannot see the bug."""
    inputs = _linear_case(1, 1)
    assert check_kernel(F.linear_forward, _published_weight_grad, inputs, wrt=[1]) < 1e-7


def _train_output_ln_only(model, x, steps, lr):
    """The published script in miniature: every gradient but the output LayerNorm's reads as 0."""
    opt = Adam(model, lr=lr)
    for _ in range(steps):
        model.zero_grad()
        _, dy = forward_loss(model, x)
        model.backward(dy)
        for name, _, grad in model.named_parameters():
            if not name.startswith(OUTPUT_LN):
                grad[...] = 0.0
        opt.step()
    return forward_loss(model, x)[0]


def test_a_tensor_whose_gradient_is_always_zero_never_moves():
    """Adam with g = 0 keeps m = v = 0 and moves by 0/(0 + ε) = 0: only the output LN changes."""
    model, x = tiny(), inputs()
    init = {name: p.copy() for name, p, _ in model.named_parameters()}
    _train_output_ln_only(model, x, steps=5, lr=1e-2)
    moved = [name for name, p, _ in model.named_parameters() if not np.array_equal(p, init[name])]
    assert moved == [OUTPUT_LN + "gamma", OUTPUT_LN + "beta"]


def test_output_ln_only_training_stays_above_the_least_squares_floor():
    """With x̂ fixed, min over γ, β of the MSE is a per-feature straight-line fit (np.linalg.lstsq);
    the chapter's closed form Var(x_j)(1 − ρ_j²) agrees with it, and training reaches it, not below."""
    model, x = tiny(), inputs(B=4, T=6)
    xhat = model.forward(x).reshape(-1, 8)                   # γ = 1, β = 0 at initialisation
    xt = x.reshape(-1, 8)
    lstsq = np.mean([np.linalg.lstsq(np.c_[xhat[:, j], np.ones(len(xt))], xt[:, j], rcond=None)[1][0]
                     for j in range(8)]) / len(xt)
    xc, tc = xhat - xhat.mean(axis=0), xt - xt.mean(axis=0)
    rho = (xc * tc).mean(axis=0) / (xc.std(axis=0) * tc.std(axis=0))
    floor = np.mean(xt.var(axis=0) * (1 - rho ** 2))
    assert abs(floor - lstsq) < 1e-12 * lstsq
    start = np.mean((xhat - xt) ** 2)
    final = _train_output_ln_only(model, x, steps=300, lr=3e-2)
    assert floor * (1 - 1e-9) <= final < floor + 0.01 * (start - floor)   # reaches it, not below

