"""Seeds 000 and 001: the two-layer transformer and the single attention layer, and their task.

Oracles: the seeds' own forward and backward equations written out line by line in NumPy
(float64), central finite differences (``tformer.gradcheck``), PyTorch autograd where installed,
a hand computation of one AdamW step, and a loop-by-loop recomputation of the task's targets.
"""
import math

import numpy as np
import pytest

import tformer.functional as F
from tformer.__main__ import main as cli_main
from tformer.data import copy_max, copy_max_centered
from tformer.gradcheck import check_module
from tformer.models.attention_layer import SYMBOLS as SYMBOLS_001
from tformer.models.attention_layer import AttentionLayer
from tformer.models.two_layer import SYMBOLS as SYMBOLS_000
from tformer.models.two_layer import TwoLayerTransformer
from tformer.optim import AdamW


def softmax_rows(S):
    E = np.exp(S - S.max(-1, keepdims=True))
    return E / E.sum(-1, keepdims=True)


def sigma(H):
    return 1.0 / (1.0 + np.exp(-H))


def params_by_symbol(model, symbols):
    named = {name: p for name, p, _ in model.named_parameters()}
    return {sym: named[name] for sym, name in symbols.items()}


def grads_by_symbol(model, symbols):
    named = {name: g for name, _, g in model.named_parameters()}
    return {sym: named[name] for sym, name in symbols.items()}


def data(B=3, T=5, d=4, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, T, d)), rng.standard_normal((B, T, d))


# --------------------------------------------------------------------------- seed 001, equations

def seed001_forward_backward(X, Y_true, W_q, W_k, W_v, W_o):
    """Seed 001's forward and backward pass, one line per equation, batched over the first axis."""
    d_model = X.shape[-1]
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    AttnScores = Q @ K.swapaxes(1, 2) / math.sqrt(d_model)
    AttnWeights = softmax_rows(AttnScores)
    AttnOutput = AttnWeights @ V
    Y = AttnOutput @ W_o
    dY = Y - Y_true
    dW_o = np.einsum("btc,btd->cd", AttnOutput, dY)                 # AttnOutputᵀ dY, summed over b
    dAttnOutput = dY @ W_o.T
    dV = AttnWeights.swapaxes(1, 2) @ dAttnOutput
    dAttnWeights = dAttnOutput @ V.swapaxes(1, 2)
    dAttnScores = AttnWeights * (dAttnWeights - (dAttnWeights * AttnWeights).sum(-1, keepdims=True))
    dQ = dAttnScores @ K / math.sqrt(d_model)
    dK = dAttnScores.swapaxes(1, 2) @ Q / math.sqrt(d_model)
    dW_q = np.einsum("btc,btd->cd", X, dQ)
    dW_k = np.einsum("btc,btd->cd", X, dK)
    dW_v = np.einsum("btc,btd->cd", X, dV)
    return Y, AttnWeights, {"W_q": dW_q, "W_k": dW_k, "W_v": dW_v, "W_o": dW_o}


def test_attention_layer_matches_seed_001_equations():
    X, Y_true = data()
    model = AttentionLayer(d_model=4, seed=3, dtype=np.float64)
    W = params_by_symbol(model, SYMBOLS_001)
    Y_ref, A_ref, grads_ref = seed001_forward_backward(X, Y_true, **W)
    Y = model.forward(X)
    loss, dY = F.mse_loss(Y, Y_true, reduction="half_sum")
    model.zero_grad()
    model.backward(dY)
    assert np.abs(Y - Y_ref).max() < 1e-12
    assert np.abs(model.att - A_ref).max() < 1e-12                  # scale 1/√d_model with one head
    assert abs(loss - 0.5 * np.sum((Y_ref - Y_true) ** 2)) < 1e-10
    got = grads_by_symbol(model, SYMBOLS_001)
    for sym, ref in grads_ref.items():
        assert np.abs(got[sym] - ref).max() < 1e-10 * max(1.0, np.abs(ref).max()), sym
    # the seed's names are the parameters themselves, not copies
    assert model.W_q is W["W_q"] and model.W_o is W["W_o"]


def test_attention_layer_scale_is_one_over_sqrt_d_model():
    d = 9
    model = AttentionLayer(d_model=d, seed=0, dtype=np.float64)
    X, _ = data(B=2, T=4, d=d)
    model.forward(X)
    S = (X @ model.W_q) @ (X @ model.W_k).swapaxes(1, 2)
    assert np.abs(model.att - softmax_rows(S / 3.0)).max() < 1e-12
    assert np.abs(model.att - softmax_rows(S)).max() > 1e-3         # the scale is really applied


def test_attention_layer_gradcheck_every_parameter():
    X, Y_true = data(B=2, T=4, d=4, seed=5)
    model = AttentionLayer(d_model=4, seed=1, dtype=np.float64)
    errs = check_module(model, X, seed=2)                          # random upstream gradient
    assert set(errs) == {*SYMBOLS_001.values(), "input"}
    assert max(errs.values()) < 1e-6, errs
    errs = check_module(model, X, loss=lambda y: F.mse_loss(y, Y_true, reduction="half_sum"))
    assert max(errs.values()) < 1e-6, errs


def test_attention_layer_has_no_biases_and_no_residual():
    model = AttentionLayer(d_model=6, seed=0, dtype=np.float64)
    assert sorted(n for n, _, _ in model.named_parameters()) == sorted(SYMBOLS_001.values())
    assert model.num_parameters() == 4 * 6 * 6
    X, _ = data(B=1, T=3, d=6)
    # no bias: Y(0) = 0; no residual: Y is linear in W_o (doubling W_o doubles Y, no X added)
    assert np.abs(model.forward(np.zeros_like(X))).max() == 0.0
    Y = model.forward(X)
    model.W_o[...] *= 2.0
    assert np.abs(model.forward(X) - 2.0 * Y).max() < 1e-12


# --------------------------------------------------------------------------- seed 000, equations

def seed000_forward_backward(X, Y_true, W):
    """Seed 000's forward pass and its 36 backward lines, written as the seed writes them."""
    d = X.shape[-1]
    c = 1.0 / math.sqrt(d)
    f = {}
    inp = X
    for l in (1, 2):
        Q, K, V = inp @ W[f"W_q,{l}"], inp @ W[f"W_k,{l}"], inp @ W[f"W_v,{l}"]
        S = Q @ K.swapaxes(1, 2) * c
        A = softmax_rows(S)
        Z = A @ V
        Zt = Z @ W[f"W_o,{l}"] + inp
        H = Zt @ W[f"W_1,{l}"]
        Sp = H * sigma(H)
        out = Sp @ W[f"W_2,{l}"] + Zt
        f[l] = dict(X=inp, Q=Q, K=K, V=V, A=A, Z=Z, Zt=Zt, H=H, Sp=Sp)
        inp = out
    Y = inp
    g = {}
    dOut = Y - Y_true                                                  # ∂L/∂Y
    for l in (2, 1):
        v = f[l]
        g[f"W_2,{l}"] = np.einsum("btk,btd->kd", v["Sp"], dOut)        # S'ᵀ ∂L/∂X_l
        dSp = dOut @ W[f"W_2,{l}"].T
        dZt = dOut.copy()                                              # ∂L/∂Z̃ = ∂L/∂X_l
        sH = sigma(v["H"])
        dH = dSp * (sH + v["H"] * sH * (1 - sH))
        g[f"W_1,{l}"] = np.einsum("btc,btk->ck", v["Zt"], dH)
        dZt += dH @ W[f"W_1,{l}"].T                                    # ∂L/∂Z̃ += ∂L/∂H W_1ᵀ
        g[f"W_o,{l}"] = np.einsum("btc,btd->cd", v["Z"], dZt)
        dZ = dZt @ W[f"W_o,{l}"].T
        dIn = dZt.copy()                                               # ∂L/∂X_{l-1} = ∂L/∂Z̃
        dA = dZ @ v["V"].swapaxes(1, 2)
        dV = v["A"].swapaxes(1, 2) @ dZ
        dS = v["A"] * (dA - (dA * v["A"]).sum(-1, keepdims=True))
        dQ = c * dS @ v["K"]
        dK = c * dS.swapaxes(1, 2) @ v["Q"]
        g[f"W_q,{l}"] = np.einsum("btc,btd->cd", v["X"], dQ)
        g[f"W_k,{l}"] = np.einsum("btc,btd->cd", v["X"], dK)
        g[f"W_v,{l}"] = np.einsum("btc,btd->cd", v["X"], dV)
        dIn += dQ @ W[f"W_q,{l}"].T + dK @ W[f"W_k,{l}"].T + dV @ W[f"W_v,{l}"].T
        dOut = dIn
    return Y, g, dOut


def test_two_layer_matches_seed_000_equations():
    X, Y_true = data(B=2, T=5, d=4, seed=7)
    model = TwoLayerTransformer(d_model=4, d_ff=6, seed=2, dtype=np.float64)
    W = params_by_symbol(model, SYMBOLS_000)
    Y_ref, g_ref, dX_ref = seed000_forward_backward(X, Y_true, W)
    Y = model.forward(X)
    _, dY = F.mse_loss(Y, Y_true, reduction="half_sum")
    model.zero_grad()
    dX = model.backward(dY)
    assert np.abs(Y - Y_ref).max() < 1e-12
    assert np.abs(dX - dX_ref).max() < 1e-10
    got = grads_by_symbol(model, SYMBOLS_000)
    assert len(got) == 12
    for sym, ref in g_ref.items():
        assert np.abs(got[sym] - ref).max() < 1e-10 * max(1.0, np.abs(ref).max()), sym


def test_two_layer_gradcheck_every_parameter():
    X, Y_true = data(B=2, T=4, d=4, seed=11)
    model = TwoLayerTransformer(d_model=4, d_ff=8, seed=4, dtype=np.float64)
    errs = check_module(model, X, seed=3)
    assert set(errs) == {*SYMBOLS_000.values(), "input"}
    assert max(errs.values()) < 1e-6, errs
    errs = check_module(model, X, loss=lambda y: F.mse_loss(y, Y_true, reduction="half_sum"))
    assert max(errs.values()) < 1e-6, errs


def test_two_layer_without_mlp_gradcheck_and_oddness():
    X, _ = data(B=2, T=4, d=4, seed=12)
    model = TwoLayerTransformer(d_model=4, use_mlp=False, seed=4, dtype=np.float64)
    assert model.num_parameters() == 2 * 4 * 16
    errs = check_module(model, X, seed=3)
    assert max(errs.values()) < 1e-6, errs
    # attention + residual without biases is an odd map; the swish MLP is not
    assert np.abs(model.forward(-X) + model.forward(X)).max() < 1e-12
    full = TwoLayerTransformer(d_model=4, seed=4, dtype=np.float64)
    assert np.abs(full.forward(-X) + full.forward(X)).max() > 1e-3


def test_two_layer_shapes_config_and_defaults():
    model = TwoLayerTransformer(d_model=8, seed=0)
    assert model.config == dict(d_model=8, d_ff=32, use_mlp=True, seed=0, dtype="float32")
    assert model.num_parameters() == 2 * (4 * 64 + 2 * 8 * 32)
    assert all(name.endswith(".W") for name, _, _ in model.named_parameters())    # no biases
    x = np.random.default_rng(0).random((3, 5, 8)).astype(np.float32)
    y = model.forward(x)
    assert y.shape == x.shape and y.dtype == np.float32
    assert [a.shape for a in model.att] == [(3, 5, 5), (3, 5, 5)]
    assert np.abs(model.att[0].sum(-1) - 1).max() < 1e-5
    with pytest.raises(ValueError, match="d_ff"):
        TwoLayerTransformer(d_model=8, d_ff=0)
    with pytest.raises(ValueError, match="d_model"):
        AttentionLayer(d_model=0)
    with pytest.raises(ValueError, match="x"):
        model.forward(np.zeros((3, 5, 7), np.float32))


@pytest.mark.torch_parity
def test_two_layer_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    X, Y_true = data(B=2, T=5, d=4, seed=13)
    model = TwoLayerTransformer(d_model=4, d_ff=6, seed=5, dtype=np.float64)
    Wt = {s: torch.tensor(w, requires_grad=True) for s, w in params_by_symbol(model, SYMBOLS_000).items()}
    x = torch.tensor(X)
    for l in (1, 2):
        Q, K, V = x @ Wt[f"W_q,{l}"], x @ Wt[f"W_k,{l}"], x @ Wt[f"W_v,{l}"]
        A = torch.softmax(Q @ K.transpose(1, 2) / 2.0, dim=-1)
        Zt = A @ V @ Wt[f"W_o,{l}"] + x
        x = torch.nn.functional.silu(Zt @ Wt[f"W_1,{l}"]) @ Wt[f"W_2,{l}"] + Zt
    L = 0.5 * ((x - torch.tensor(Y_true)) ** 2).sum()
    L.backward()
    Y = model.forward(X)
    loss, dY = F.mse_loss(Y, Y_true, reduction="half_sum")
    model.zero_grad()
    model.backward(dY)
    assert abs(loss - L.item()) < 1e-10 * max(1.0, abs(L.item()))
    got = grads_by_symbol(model, SYMBOLS_000)
    for sym, w in Wt.items():
        assert np.abs(got[sym] - w.grad.numpy()).max() < 1e-10, sym


# --------------------------------------------------------------------------- AdamW, ε inside √

def test_one_adamw_step_by_hand():
    """W ← (1 − λη) W − η · m̂ / √(v̂ + ε); at t = 1, m̂ = g and v̂ = g²."""
    model = AttentionLayer(d_model=2, seed=0, dtype=np.float64)
    lr, wd, eps = 0.1, 0.01, 0.01                  # ε this large so that its placement shows
    values = {"W_q": [[0.5, -0.25], [1.0, 0.0]], "W_k": [[0.1, 0.2], [0.3, 0.4]],
              "W_v": [[1.0, 0.0], [0.0, 1.0]], "W_o": [[-0.5, 0.5], [0.25, 2.0]]}
    grads = {"W_q": [[0.2, 0.0], [-0.3, 1.0]], "W_k": [[0.0, 0.1], [0.0, 0.0]],
             "W_v": [[-2.0, 0.5], [0.05, 0.0]], "W_o": [[0.3, -0.1], [0.0, 0.7]]}
    P, G = params_by_symbol(model, SYMBOLS_001), grads_by_symbol(model, SYMBOLS_001)
    for sym in values:
        P[sym][...] = values[sym]
        G[sym][...] = grads[sym]
    opt = AdamW(model, lr=lr, betas=(0.9, 0.999), eps=eps, weight_decay=wd, eps_inside_sqrt=True)
    opt.step()
    # one entry with numbers: W = 0.5, g = 0.2: 0.5·(1 − 0.001) − 0.1 · 0.2 / √(0.04 + 0.01)
    assert abs(P["W_q"][0, 0] - (0.4995 - 0.02 / math.sqrt(0.05))) < 1e-15
    assert abs(P["W_q"][0, 0] - 0.41005728) < 1e-8
    # a zero gradient only decays: W = −0.25 → −0.25 · 0.999
    assert abs(P["W_q"][0, 1] - (-0.24975)) < 1e-15
    for sym in values:
        W0, g = np.array(values[sym]), np.array(grads[sym])
        m_hat = (1 - 0.9) * g / (1 - 0.9)
        v_hat = (1 - 0.999) * g * g / (1 - 0.999)
        expected = (1 - wd * lr) * W0 - lr * m_hat / np.sqrt(v_hat + eps)
        assert np.abs(P[sym] - expected).max() < 1e-14, sym
    # the other placement (√v̂ + ε, seed 004) gives a different step here
    outside = (1 - wd * lr) * 0.5 - lr * 0.2 / (math.sqrt(0.04) + eps)
    assert abs(P["W_q"][0, 0] - outside) > 1e-3


# --------------------------------------------------------------------------- the task

def test_copy_max_targets_checked_by_loops():
    x, y = copy_max.copy_max_batch(3, batch_size=5, seq_len=7, d_model=4, seed=9, dtype=np.float64)
    assert x.shape == y.shape == (5, 7, 4)
    assert 0.0 <= x.min() and x.max() < 1.0                        # U(0, 1)
    for b in range(5):
        firsts = [float(x[b, t, 0]) for t in range(7)]
        j = firsts.index(max(firsts))
        assert copy_max.argmax_rows(x)[b] == j
        for t in range(7):
            assert list(y[b, t]) == list(x[b, j])


def test_copy_max_batches_are_pure_functions_of_seed_split_index():
    a = copy_max.copy_max_batch(4, batch_size=2, seq_len=3, d_model=2, seed=1)
    b = copy_max.copy_max_batch(4, batch_size=2, seq_len=3, d_model=2, seed=1)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    for other in (copy_max.copy_max_batch(5, batch_size=2, seq_len=3, d_model=2, seed=1),
                  copy_max.copy_max_batch(4, batch_size=2, seq_len=3, d_model=2, seed=2),
                  copy_max.copy_max_batch(4, batch_size=2, seq_len=3, d_model=2, seed=1, split="test")):
        assert np.abs(other[0] - a[0]).max() > 1e-3
    assert a[0].dtype == np.float32
    with pytest.raises(ValueError, match="split"):
        copy_max.copy_max_batch(0, split="valid")
    with pytest.raises(ValueError, match="index"):
        copy_max.copy_max_batch(-1)
    with pytest.raises(ValueError, match="seq_len"):
        copy_max.copy_max_batch(0, seq_len=0)


def test_centered_task_targets_and_distribution():
    x, y = copy_max_centered.centered_copy_max_batch(0, batch_size=64, seq_len=6, d_model=8,
                                                     dtype=np.float64)
    assert x.min() < -1.0 and abs(x.mean()) < 0.1 and abs(x.std() - 1.0) < 0.1    # N(0, 1)
    for b in range(64):
        j = max(range(6), key=lambda t: x[b, t, 0])
        assert np.array_equal(y[b], np.repeat(x[b, j][None], 6, axis=0))
    held = copy_max_centered.held_out(2, batch_size=3, seq_len=4, d_model=2)
    assert len(held) == 2 and held[0][0].shape == (3, 4, 2)


def test_nearest_row_accuracy_by_hand():
    x = np.array([[[0.1, 0.0], [0.9, 1.0], [0.5, 0.0]]])            # row 1 has the largest first feature
    assert copy_max.argmax_rows(x).tolist() == [1]
    y = np.array([[[0.8, 0.9], [0.4, 0.1], [0.9, 1.0]]])            # nearest rows: 1, 2, 1
    assert copy_max.nearest_rows(y, x).tolist() == [[1, 2, 1]]
    assert abs(copy_max.nearest_row_accuracy(y, x, np.array([1])) - 2 / 3) < 1e-15
    m = copy_max.evaluate(IdentityTarget(), [(x, copy_max.copy_max_targets(x))])
    assert m == {"loss": 0.0, "accuracy": 1.0, "seq_accuracy": 1.0}


class IdentityTarget:
    """A perfect 'model' of the copy-max task, for checking the metric."""

    def forward(self, x):
        return copy_max.copy_max_targets(x)


def test_untrained_model_is_near_chance():
    held = copy_max.held_out(2, batch_size=64, seq_len=8, d_model=16)
    m = copy_max.evaluate(AttentionLayer(d_model=16, seed=0), held)
    assert m["accuracy"] < 0.4 and m["loss"] > 1.0


# --------------------------------------------------------------------------- command line

def test_cli_attention_smoke(capsys):
    assert cli_main(["run", "attention", "--steps", "3", "--d-model", "4", "--seq-len", "3",
                     "--batch-size", "2", "--eval-batches", "1"]) == 0
    out = capsys.readouterr().out
    assert "final training loss" in out and "held-out accuracy:" in out


def test_cli_transformer2_smoke(capsys, tmp_path):
    ck = tmp_path / "t2.npz"
    assert cli_main(["run", "transformer2", "--steps", "2", "--d-model", "4", "--d-ff", "4",
                     "--seq-len", "3", "--batch-size", "2", "--eval-batches", "1",
                     "--task", "copy_max_centered", "--checkpoint", str(ck)]) == 0
    out = capsys.readouterr().out
    assert "transformer2 on copy_max_centered" in out and "held-out accuracy:" in out
    assert ck.exists()


def test_cli_help_documents_flags(capsys):
    for system, extra in (("attention", []), ("transformer2", ["--d-ff", "--task", "--no-mlp"])):
        with pytest.raises(SystemExit) as exc:
            cli_main(["run", system, "--help"])
        assert exc.value.code == 0
        out = capsys.readouterr().out
        for flag in ["--d-model", "--seq-len", "--batch-size", "--steps", "--lr", "--seed", *extra]:
            assert flag in out, (system, flag)
