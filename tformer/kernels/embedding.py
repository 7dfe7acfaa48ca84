"""Embedding lookup kernel: E = W[tokens], and the scatter-add that is its gradient."""
from typing import NamedTuple

import numpy as np


class EmbeddingCache(NamedTuple):
    tokens: np.ndarray      # (B, T) integers
    W_shape: tuple          # (V, C)


def embedding_forward(tokens, W):
    """E[b, t, :] = W[tokens[b, t], :].

    Shapes: ``tokens: (B, T)`` integers in ``[0, V)``, ``W: (V, C)``  ->  ``E: (B, T, C)``.
    Returns ``E, cache``.
    """
    return W[tokens], EmbeddingCache(tokens, W.shape)


def embedding_backward(dE, cache):
    """dW[v, :] = Σ_{(b,t): tokens[b,t] = v} dE[b, t, :].

    A row of W receives the sum of the upstream gradients of every position that looked it up:
    ``np.add.at`` adds each ``dE[b, t]`` into row ``tokens[b, t]``, repeats included.
    Shapes: ``dE: (B, T, C)`` -> ``dW: (V, C)``.
    """
    tokens, W_shape = cache
    dW = np.zeros(W_shape, dtype=dE.dtype)
    np.add.at(dW, tokens, dE)
    return dW
