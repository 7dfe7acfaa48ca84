"""Linear layer kernel: Y = X W + b, and its three gradients, as the linear chapter derives them;
and the backward pass of a layer whose W is frozen (dX and db, no dW).

The layers call the faster version ``tformer.fast.linear`` (threads, ``out=``, ``accumulate=``,
float16/bfloat16), through ``tformer.nn.functional``; ``tests/kernels/test_fast_linear.py`` holds it equal to
this one.
"""
from typing import NamedTuple

import numpy as np


class LinearCache(NamedTuple):
    """What the backward pass needs from the forward pass."""
    x: np.ndarray          # X: (..., C_in)
    W: np.ndarray          # W: (C_in, C_out)
    has_b: bool            # whether Y has a bias b


def linear_forward(x, W, b=None):
    """Y = X W + b.

    Shapes: ``x: (..., C_in)``, ``W: (C_in, C_out)``, ``b: (C_out,)`` or None  ->  ``y: (..., C_out)``.
    The leading axes are flattened into one product of ``N = B·T`` rows (no loop over the batch).
    Returns ``y, cache``.
    """
    x2 = x.reshape(-1, W.shape[0])                      # (N, C_in), N = B·T
    y = x2 @ W                                          # (N, C_out)
    if b is not None:
        y = y + b                                       # b added to every row
    return y.reshape(*x.shape[:-1], W.shape[1]), LinearCache(x, W, b is not None)


def linear_backward(dy, cache):
    """dX = dY Wᵀ,  dW = Xᵀ dY,  db = Σ_rows dY.

    In the forward pass Y = X W + b, so each output row is a linear map of one input row:
    the input gradient goes back through Wᵀ, and the weight gradient sums the outer products
    xᵢᵀ dyᵢ over all ``N = B·T`` rows, which is exactly one product ``X₂ᵀ dY₂``.
    Shapes: ``dy: (..., C_out)`` -> ``(dx: (..., C_in), dW: (C_in, C_out), db: (C_out,) or None)``.
    """
    x, W, has_b = cache
    dy2 = dy.reshape(-1, W.shape[1])                    # (N, C_out)
    x2 = x.reshape(-1, W.shape[0])                      # (N, C_in)
    dx = dy2 @ W.T                                      # dX = dY Wᵀ   (N, C_in)
    dW = x2.T @ dy2                                     # dW = Xᵀ dY   (C_in, C_out)
    db = dy2.sum(axis=0) if has_b else None             # db = Σ_rows dY   (C_out,)
    return dx.reshape(x.shape), dW, db


def linear_backward_without_dW(dy, cache):
    """dX = dY Wᵀ,  db = Σ_rows dY: the backward pass of a layer whose W is frozen (``Module.freeze``,
    LoRA's base), where dW = Xᵀ dY is never formed.

    Shapes: ``dy: (..., C_out)`` -> ``(dx: (..., C_in), db: (C_out,) or None)``.
    """
    x, W, has_b = cache
    dy2 = dy.reshape(-1, W.shape[1])                    # (N, C_out)
    dx = dy2 @ W.T                                      # dX = dY Wᵀ   (N, C_in)
    db = dy2.sum(axis=0) if has_b else None             # db = Σ_rows dY   (C_out,)
    return dx.reshape(x.shape), db
