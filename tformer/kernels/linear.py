"""Linear layer kernel: Y = X W + b, and its three gradients."""
import numpy as np

from .. import parallel
from .._dtypes import matmul
from .._validate import float_array, same_dtype

# Split a product by rows only when each part has at least this many multiply-adds: below
# it the hand-off to another thread costs more than it saves. 2M multiply-adds take about
# 20 µs on one core, about a hand-off's cost; and each row block of a skinny product (a
# few rows: decoding) reads all of W again.
_MIN_MACS = 1 << 21


def linear_forward(x, W, b=None, out=None):
    """Y = X W + b.

    Shapes: ``x: (..., C_in)``, ``W: (C_in, C_out)``, ``b: (C_out,)`` or None  ->  ``y: (..., C_out)``.
    The leading axes are flattened into one GEMM of ``B·T`` rows (no loop over batch); with
    ``tformer.parallel`` threads, each thread computes a block of those rows and adds b to it.
    In float16/bfloat16 the products accumulate in float32 (``tformer._dtypes.matmul``).
    ``out``: a C-contiguous array of y's shape and W's dtype to write y into (e.g. one part of a
    larger batch's logits), instead of a new array.
    Returns ``y, cache``.
    """
    float_array("x", x, min_ndim=1)
    float_array("W", W, ndim=2)
    if x.shape[-1] != W.shape[0]:
        raise ValueError(f"x: last axis must match W's first: x {x.shape}, W {W.shape}")
    if b is not None:
        float_array("b", b, ndim=1)
        if b.shape[0] != W.shape[1]:
            raise ValueError(f"b: expected shape ({W.shape[1]},), got {b.shape}")
    same_dtype(x=x, W=W, b=b)
    x2 = x.reshape(-1, W.shape[0])                      # (N, C_in), N = B·T
    shape = (*x.shape[:-1], W.shape[1])
    if out is None:
        y = np.empty((x2.shape[0], W.shape[1]), W.dtype)    # (N, C_out)
    elif (not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != W.dtype
          or not out.flags.c_contiguous):
        raise ValueError(f"out: expected a C-contiguous {W.dtype} array of shape {shape}, got "
                         f"{getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}")
    else:
        y = out.reshape(x2.shape[0], W.shape[1])        # a view: written through

    def rows(lo, hi):
        matmul(x2[lo:hi], W, out=y[lo:hi])
        if b is not None:
            y[lo:hi] += b

    parallel.parallel_for(rows, x2.shape[0], grain=-(-_MIN_MACS // W.size))
    return y.reshape(shape), (x, W, b is not None)


def linear_backward(dy, cache, accumulate=None):
    """dX = dY Wᵀ,  dW = Xᵀ dY,  db = Σ_rows dY.

    In the forward pass Y = X W + b, so each output row is a linear map of one input row:
    the input gradient goes back through Wᵀ, and the weight gradient sums the outer products
    xᵢᵀ dyᵢ over all ``N = B·T`` rows, which is exactly one GEMM ``X₂ᵀ dY₂``.
    Shapes: ``dy: (..., C_out)`` -> ``(dx: (..., C_in), dW: (C_in, C_out), db: (C_out,) or None)``.
    ``accumulate=(gW, gb)``: add dW and db into these arrays (a module's running gradients), inside
    the thread that computed them, and return them in place of dW and db.
    """
    x, W, has_b = cache
    if dy.shape != (*x.shape[:-1], W.shape[1]):
        raise ValueError(f"dy: expected shape {(*x.shape[:-1], W.shape[1])}, got {dy.shape}")
    dy2 = dy.reshape(-1, W.shape[1])                    # (N, C_out)
    x2 = x.reshape(-1, W.shape[0])                      # (N, C_in)

    if accumulate is not None:
        gW, gb = accumulate
        if gW.shape != W.shape or (has_b and (gb is None or gb.shape != (W.shape[1],))):
            raise ValueError(f"accumulate: expected arrays of shapes {W.shape} and ({W.shape[1]},), got "
                             f"{gW.shape} and {None if gb is None else gb.shape}")

    def input_and_bias_grads():
        dx = matmul(dy2, W.T)                           # (N, C_in)
        # Σ over the N rows as a vector-matrix product 1ᵀ dY₂: BLAS sums rows faster than sum(axis=0).
        db = matmul(np.ones(dy2.shape[0], dy2.dtype), dy2) if has_b else None   # (C_out,)
        if has_b and accumulate is not None:
            np.add(gb, db, out=gb)
            db = gb
        return dx, db

    def weight_grad():
        dW = matmul(x2.T, dy2)                          # (C_in, C_out)
        if accumulate is None:
            return dW
        return np.add(gW, dW, out=gW)

    # dX and dW cost the same N·C_in·C_out multiply-adds and share only their inputs: with threads
    # they run side by side, each a whole product, so no sum is ever split. db (a pass over dY)
    # goes with dX, the accumulation into gW (a pass over W) with dW, to balance the two.
    (dx, db), dW = parallel.run_tasks(input_and_bias_grads, weight_grad)
    return dx.reshape(x.shape), dW, db                  # (..., C_in), (C_in, C_out), (C_out,)
