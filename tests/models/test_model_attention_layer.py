"""The single attention layer (tformer/models/attention_layer.py) on the copy-the-max-row task.

Oracles: the layer's forward and backward equations written out line by line in NumPy (float64),
central finite differences (``tformer.core.gradcheck``), and the held-out metric of an untrained layer.
The task's data: tests/data/test_data_copy_max.py; the AdamW step it trains with: tests/training/test_optim.py.
"""
import math

import numpy as np
import pytest
from model_symbols import data, grads_by_symbol, params_by_symbol, softmax_rows

import tformer.nn.functional as F
from tformer.__main__ import main as cli_main
from tformer.data import copy_max
from tformer.core.gradcheck import check_module
from tformer.models.attention_layer import SYMBOLS, AttentionLayer


# --------------------------------------------------------------------------- the equations

def equations_forward_backward(X, Y_true, W_q, W_k, W_v, W_o):
    """The layer's forward and backward pass, one line per equation, batched over the first axis."""
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


def test_attention_layer_matches_its_equations():
    X, Y_true = data()
    model = AttentionLayer(d_model=4, seed=3, dtype=np.float64)
    W = params_by_symbol(model, SYMBOLS)
    Y_ref, A_ref, grads_ref = equations_forward_backward(X, Y_true, **W)
    Y = model.forward(X)
    loss, dY = F.mse_loss(Y, Y_true, reduction="half_sum")
    model.zero_grad()
    model.backward(dY)
    assert np.abs(Y - Y_ref).max() < 1e-12
    assert np.abs(model.att - A_ref).max() < 1e-12                  # scale 1/√d_model with one head
    assert abs(loss - 0.5 * np.sum((Y_ref - Y_true) ** 2)) < 1e-10
    got = grads_by_symbol(model, SYMBOLS)
    for sym, ref in grads_ref.items():
        assert np.abs(got[sym] - ref).max() < 1e-10 * max(1.0, np.abs(ref).max()), sym
    # the chapter's names are the parameters themselves, not copies
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
    assert set(errs) == {*SYMBOLS.values(), "input"}
    assert max(errs.values()) < 1e-6, errs
    errs = check_module(model, X, loss=lambda y: F.mse_loss(y, Y_true, reduction="half_sum"))
    assert max(errs.values()) < 1e-6, errs


def test_attention_layer_has_no_biases_and_no_residual():
    model = AttentionLayer(d_model=6, seed=0, dtype=np.float64)
    assert sorted(n for n, _, _ in model.named_parameters()) == sorted(SYMBOLS.values())
    assert model.num_parameters() == 4 * 6 * 6
    X, _ = data(B=1, T=3, d=6)
    # no bias: Y(0) = 0; no residual: Y is linear in W_o (doubling W_o doubles Y, no X added)
    assert np.abs(model.forward(np.zeros_like(X))).max() == 0.0
    Y = model.forward(X)
    model.W_o[...] *= 2.0
    assert np.abs(model.forward(X) - 2.0 * Y).max() < 1e-12


def test_attention_layer_refuses_a_zero_width():
    with pytest.raises(ValueError, match="d_model"):
        AttentionLayer(d_model=0)


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


def test_cli_help_documents_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["run", "attention", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ["--d-model", "--seq-len", "--batch-size", "--steps", "--lr", "--seed"]:
        assert flag in out, flag
