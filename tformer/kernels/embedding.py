"""Embedding lookup kernel: E = W[tokens], and the scatter-add that is its gradient."""
import numpy as np

from .._dtypes import compute_dtype
from .._validate import float_array, int_array, index_range


def embedding_forward(tokens, W):
    """E[b, t, :] = W[tokens[b, t], :].

    Shapes: ``tokens: (B, T)`` integers in ``[0, V)``, ``W: (V, C)``  ->  ``E: (B, T, C)``.
    Returns ``E, cache``.
    """
    int_array("tokens", tokens)
    float_array("W", W, ndim=2)
    index_range("tokens", tokens, 0, W.shape[0])
    return W[tokens], (tokens, W.shape)


def embedding_backward(dE, cache):
    """dW[v, :] = Σ_{(b,t): tokens[b,t] = v} dE[b, t, :].

    A row of W receives the sum of the upstream gradients of every position that looked it up.
    ``np.add.at`` does this but slowly; here the positions are sorted by token once and each run
    of equal tokens is summed with ``np.add.reduceat`` (one vectorised pass over ``B·T`` rows),
    in float32 when ``dE`` is float16/bfloat16 (a frequent token's row sums thousands of terms).
    Shapes: ``dE: (B, T, C)`` -> ``dW: (V, C)``.
    """
    tokens, (V, C) = cache
    if dE.shape != (*tokens.shape, C):
        raise ValueError(f"dE: expected shape {(*tokens.shape, C)}, got {dE.shape}")
    flat = tokens.ravel()
    order = np.argsort(flat, kind="stable")
    ids, starts = np.unique(flat[order], return_index=True)
    dW = np.zeros((V, C), dtype=dE.dtype)
    rows = dE.reshape(-1, C)[order]                      # (B·T, C), grouped by token
    dW[ids] = np.add.reduceat(rows, starts, axis=0, dtype=compute_dtype(dE.dtype))
    return dW
