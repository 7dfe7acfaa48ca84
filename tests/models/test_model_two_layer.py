"""The two-layer transformer (tformer/models/two_layer.py): two attention + swish-MLP layers with
residuals, no biases, no LayerNorm.

Oracles: its forward pass and 36 backward lines written out in NumPy (float64), central finite
differences (``tformer.core.gradcheck``), and PyTorch autograd in float64.
"""
import math

import numpy as np
import pytest
from model_symbols import data, grads_by_symbol, params_by_symbol, sigma, softmax_rows

import tformer.nn.functional as F
from tformer.__main__ import main as cli_main
from tformer.core.gradcheck import check_module
from tformer.models.two_layer import SYMBOLS, TwoLayerTransformer


# --------------------------------------------------------------------------- the equations

def equations_forward_backward(X, Y_true, W):
    """The forward pass and its 36 backward lines, as the two-layer transformer's chapter writes them."""
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


def test_two_layer_matches_its_equations():
    X, Y_true = data(B=2, T=5, d=4, seed=7)
    model = TwoLayerTransformer(d_model=4, d_ff=6, seed=2, dtype=np.float64)
    W = params_by_symbol(model, SYMBOLS)
    Y_ref, g_ref, dX_ref = equations_forward_backward(X, Y_true, W)
    Y = model.forward(X)
    _, dY = F.mse_loss(Y, Y_true, reduction="half_sum")
    model.zero_grad()
    dX = model.backward(dY)
    assert np.abs(Y - Y_ref).max() < 1e-12
    assert np.abs(dX - dX_ref).max() < 1e-10
    got = grads_by_symbol(model, SYMBOLS)
    assert len(got) == 12
    for sym, ref in g_ref.items():
        assert np.abs(got[sym] - ref).max() < 1e-10 * max(1.0, np.abs(ref).max()), sym


def test_two_layer_gradcheck_every_parameter():
    X, Y_true = data(B=2, T=4, d=4, seed=11)
    model = TwoLayerTransformer(d_model=4, d_ff=8, seed=4, dtype=np.float64)
    errs = check_module(model, X, seed=3)
    assert set(errs) == {*SYMBOLS.values(), "input"}
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
    with pytest.raises(ValueError, match="x"):
        model.forward(np.zeros((3, 5, 7), np.float32))


@pytest.mark.torch_parity
def test_two_layer_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    X, Y_true = data(B=2, T=5, d=4, seed=13)
    model = TwoLayerTransformer(d_model=4, d_ff=6, seed=5, dtype=np.float64)
    Wt = {s: torch.tensor(w, requires_grad=True) for s, w in params_by_symbol(model, SYMBOLS).items()}
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
    got = grads_by_symbol(model, SYMBOLS)
    for sym, w in Wt.items():
        assert np.abs(got[sym] - w.grad.numpy()).max() < 1e-10, sym


# --------------------------------------------------------------------------- command line

def test_cli_transformer2_smoke(capsys, tmp_path):
    ck = tmp_path / "t2.npz"
    assert cli_main(["run", "transformer2", "--steps", "2", "--d-model", "4", "--d-ff", "4",
                     "--seq-len", "3", "--batch-size", "2", "--eval-batches", "1",
                     "--task", "copy_max_centered", "--checkpoint", str(ck)]) == 0
    out = capsys.readouterr().out
    assert "transformer2 on copy_max_centered" in out and "held-out accuracy:" in out
    assert ck.exists()


def test_cli_help_documents_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["run", "transformer2", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ["--d-model", "--seq-len", "--batch-size", "--steps", "--lr", "--seed",
                 "--d-ff", "--task", "--no-mlp"]:
        assert flag in out, flag
