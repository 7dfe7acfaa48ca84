"""Y = X W + b and its gradients dX = dY Wᵀ, dW = Xᵀ dY, db = Σ_rows dY (all three, or dX and db
alone when W is frozen): the faster version of ``tformer.kernels.linear`` (same results;
``tests/kernels/test_fast_linear.py`` holds them equal).

What makes it faster: the rows are split across ``tformer.core.parallel`` threads, y is written into a
buffer it is given (``out=``), dW and db are added into the running gradients inside the thread
that computed them (``accumulate=``), dX and dW run side by side, and float16/bfloat16 products
accumulate in float32 (``tformer.core.dtypes.matmul``). No argument checks: ``tformer.nn.functional``
checks once, where input enters.
"""
import numpy as np

from tformer.core import parallel
from tformer.core.dtypes import matmul
from tformer.kernels.linear import LinearCache

# Split a product by rows only when each part has at least this many multiply-adds: below
# it the hand-off to another thread costs more than it saves. 2M multiply-adds take about
# 20 µs on one core, about a hand-off's cost; and each row block of a skinny product (a
# few rows: decoding) reads all of W again.
_MIN_MACS = 1 << 21


def linear_forward(x, W, b=None, out=None):
    """Y = X W + b (``kernels.linear.linear_forward``), each thread computing a block of rows.

    ``out``: a C-contiguous array of y's shape and W's dtype to write y into (e.g. one part of a
    larger batch's logits), instead of a new array. Returns ``y, cache``.
    """
    x2 = x.reshape(-1, W.shape[0])                      # (N, C_in), N = B·T
    shape = (*x.shape[:-1], W.shape[1])
    if out is None:
        y = np.empty((x2.shape[0], W.shape[1]), W.dtype)    # (N, C_out)
    else:
        y = out.reshape(x2.shape[0], W.shape[1])        # a view: written through

    parallel.parallel_for(lambda lo, hi: forward_rows(x2[lo:hi], W, b, y[lo:hi]), x2.shape[0],
                          grain=-(-_MIN_MACS // W.size))
    return y.reshape(shape), LinearCache(x, W, b is not None)


def forward_rows(x2, W, b, y):
    """y = x2 W + b for a block of rows ``x2: (n, C_in)``, written into ``y: (n, C_out)``."""
    matmul(x2, W, out=y)
    if b is not None:
        y += b


def linear_backward(dy, cache, accumulate=None):
    """dX = dY Wᵀ, dW = Xᵀ dY, db = Σ_rows dY (``kernels.linear.linear_backward``), dX and dW in
    two threads.

    ``accumulate=(gW, gb)``: add dW and db into these arrays (a module's running gradients), inside
    the thread that computed them, and return them in place of dW and db.
    """
    x, W, has_b = cache
    dy2 = dy.reshape(-1, W.shape[1])                    # (N, C_out)
    x2 = x.reshape(-1, W.shape[0])                      # (N, C_in)

    def input_and_bias_grads():                         # dX = dY Wᵀ and db = 1ᵀ dY
        return linear_backward_without_dW(dy, cache, None if accumulate is None else accumulate[1])

    def weight_grad():
        dW = matmul(x2.T, dy2)                          # (C_in, C_out)
        if accumulate is None:
            return dW
        return np.add(accumulate[0], dW, out=accumulate[0])

    # dX and dW cost the same N·C_in·C_out multiply-adds and share only their inputs: with threads
    # they run side by side, each a whole product, so no sum is ever split. db (a pass over dY)
    # goes with dX, the accumulation into gW (a pass over W) with dW, to balance the two.
    (dx, db), dW = parallel.run_tasks(input_and_bias_grads, weight_grad)
    return dx, dW, db                                   # (..., C_in), (C_in, C_out), (C_out,)


def linear_backward_without_dW(dy, cache, accumulate=None, bias=True):
    """dX = dY Wᵀ, db = 1ᵀ dY (``kernels.linear.linear_backward_without_dW``): the backward pass
    of a layer whose W is frozen, and the half of ``linear_backward`` that runs beside dW.

    ``accumulate``: b's running gradient, to add db into (returned in place of db); ``bias=False``:
    b is frozen too and db is not formed (None). ``dy: (..., C_out)`` -> ``(dx: (..., C_in), db)``.
    """
    x, W, has_b = cache
    dy2 = dy.reshape(-1, W.shape[1])                    # (N, C_out)
    dx = matmul(dy2, W.T)                               # (N, C_in)
    db = None
    if has_b and bias:
        # Σ over the N rows as a vector-matrix product 1ᵀ dY₂: BLAS sums rows faster than sum(axis=0).
        db = matmul(np.ones(dy2.shape[0], dy2.dtype), dy2)                  # (C_out,)
        if accumulate is not None:
            db = np.add(accumulate, db, out=accumulate)
    return dx.reshape(x.shape), db
