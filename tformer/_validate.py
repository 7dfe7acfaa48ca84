"""Input checks shared by the kernels: every message names the argument, what was expected and what came.

Bad input raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, wrong shape or
value) here, at the boundary, instead of an ``IndexError`` or a NaN from deep inside a kernel.
"""
import numpy as np

from ._dtypes import FLOATS


def float_array(name, x, ndim=None, min_ndim=None):
    """Check that ``x`` is a float ndarray (float32, float64, or float16/bfloat16 for mixed
    precision), optionally of a given rank; return it."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a NumPy float32/float64 array, got {type(x).__name__}")
    if x.dtype not in FLOATS:
        raise TypeError(f"{name}: expected dtype float32, float64, float16 or bfloat16, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {x.shape}")
    if min_ndim is not None and x.ndim < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dimensions, got shape {x.shape}")
    return x


def int_array(name, x, ndim=None):
    """Check that ``x`` is an integer ndarray (token ids, targets); return it."""
    if not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.integer):
        got = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise TypeError(f"{name}: expected an integer NumPy array, got {got}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {x.shape}")
    return x


def same_dtype(**arrays):
    """All arrays share one float dtype (no silent upcast in a hot path)."""
    dtypes = {k: v.dtype for k, v in arrays.items() if v is not None}
    if len(set(dtypes.values())) > 1:
        desc = ", ".join(f"{k}={d}" for k, d in dtypes.items())
        raise TypeError(f"dtype mismatch: {desc}; cast explicitly (one float dtype throughout)")


def shape_is(name, x, shape):
    """``x.shape == shape``."""
    if x.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {x.shape}")


def index_range(name, x, low, high, ignore=None):
    """Every entry of the integer array ``x`` lies in ``[low, high)`` (entries equal to ``ignore`` skipped)."""
    if x.size == 0:
        return
    vals = x if ignore is None else x[x != ignore]
    if vals.size and (vals.min() < low or vals.max() >= high):
        raise ValueError(f"{name}: expected values in [{low}, {high}), "
                         f"got min {vals.min()} and max {vals.max()}")
