"""Embedding, faster: E = W[tokens], and its gradient dW[v] = Σ_{tokens = v} dE by sorting.

Equal to ``tformer.kernels.embedding`` (``tests/kernels/test_fast_embedding.py``). The backward sorts the
positions by token once and sums each run of equal tokens with ``np.add.reduceat`` (one vectorised
pass), instead of ``np.add.at``'s slow unbuffered scatter; float16/bfloat16 sum in float32.
"""
import numpy as np

from tformer.core.dtypes import compute_dtype
from tformer.kernels.embedding import embedding_forward  # noqa: F401


# embedding_forward is the kernel's own (imported above): one fancy-indexing gather.


def embedding_backward(dE, cache):
    """dW[v, :] = Σ_{(b,t): tokens[b,t] = v} dE[b, t, :].

    A row of W receives the sum of the upstream gradients of every position that looked it up.
    ``np.add.at`` does this but slowly; here the positions are sorted by token once and each run
    of equal tokens is summed with ``np.add.reduceat`` (one vectorised pass over ``B·T`` rows),
    in float32 when ``dE`` is float16/bfloat16 (a frequent token's row sums thousands of terms).
    Shapes: ``dE: (B, T, C)`` -> ``dW: (V, C)``.
    """
    tokens, (V, C) = cache
    flat = tokens.ravel()
    order = np.argsort(flat, kind="stable")
    ids, starts = np.unique(flat[order], return_index=True)
    dW = np.zeros((V, C), dtype=dE.dtype)
    rows = dE.reshape(-1, C)[order]                      # (B·T, C), grouped by token
    dW[ids] = np.add.reduceat(rows, starts, axis=0, dtype=compute_dtype(dE.dtype))
    return dW
