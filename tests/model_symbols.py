"""Shared by the tests of the single attention layer and the two-layer transformer: a model's
parameters and gradients by their chapter symbols (``W_q``, ``W_1,2``, ...), the row softmax and
the logistic sigmoid written out in NumPy, and a random (input, target) pair."""
import numpy as np


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
