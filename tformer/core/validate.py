"""Input checks shared by the kernels: every message names the argument, what was expected and what came.

Bad input raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, wrong shape or
value) here, at the boundary, instead of an ``IndexError`` or a NaN from deep inside a kernel.
"""
import numpy as np

from tformer.core.dtypes import FLOATS


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


# -- the inputs of the models (every forward pass: checks of shapes and one pass at most) --------

def nonempty(name, x, unit="position"):
    """``x: (B, T, ...)`` holds at least one sequence (B ≥ 1) of at least one position (T ≥ 1).

    A model refuses an empty batch at its boundary: there is nothing to predict, and the mean
    loss over zero targets is undefined (the kernels underneath follow NumPy: empty in, empty out).
    """
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name}: expected at least one sequence (B ≥ 1) of at least one {unit} "
                         f"(T ≥ 1), got shape {x.shape}")


def sequences(name, x, d_model, dtype):
    """``x: (B, T, d_model)``, B, T ≥ 1, finite, of the dtype of the weights it meets; returned.

    The input of the models that read float rows (the single attention layer, the two-layer transformer, the post-LN encoder). A NaN or ±inf would
    become NaN scores in the first attention layer; it is refused here, named as the model's.
    """
    float_array(name, x, ndim=3)
    if x.shape[2] != d_model:
        raise ValueError(f"{name}: expected last axis d_model = {d_model}, got shape {x.shape}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype).name} (the model's), got {x.dtype}")
    nonempty(name, x)
    if not np.isfinite(x).all():
        raise ValueError(f"{name}: expected finite values, got {int(np.isnan(x).sum())} NaN and "
                         f"{int(np.isinf(x).sum())} ±inf entries")
    return x


def token_batch(name, tokens, max_len, start=0):
    """``tokens: (B, T)`` integers, B, T ≥ 1, with ``start + T ≤ max_len`` positions; returned.

    The ids themselves are checked against [0, V) by the embedding (``index_range``), once.
    """
    int_array(name, tokens, ndim=2)
    nonempty(name, tokens, "token")
    if start + tokens.shape[1] > max_len:
        raise ValueError(f"{name}: {start + tokens.shape[1]} positions exceed max_len = {max_len}")
    return tokens


def attention_mask(name, mask, scores, additive=True):
    """``mask`` broadcasts to the attention scores' shape ``scores`` (B, H, T_q, T_k); returned.

    Boolean (True = may attend) or, when ``additive``, float (added to the scores: −inf blocks,
    so NaN and +inf are refused). A key column every query must skip is ``(B, 1, 1, T)``.
    """
    kinds = "boolean or float" if additive else "boolean"
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"{name}: expected a {kinds} NumPy array, got {type(mask).__name__}")
    is_float = additive and np.issubdtype(mask.dtype, np.floating)
    if mask.dtype != bool and not is_float:
        raise TypeError(f"{name}: expected a {kinds} NumPy array, got {mask.dtype}")
    scores = tuple(scores)
    if mask.ndim > len(scores) or any(m not in (1, s) for m, s in zip(mask.shape[::-1], scores[::-1])):
        B, T_k = scores[0], scores[-1]
        raise ValueError(f"{name}: expected a shape that broadcasts to the scores (B, H, T, T) = "
                         f"{scores}, e.g. (B, 1, 1, T) = {(B, 1, 1, T_k)}; got {mask.shape}")
    if is_float and (np.isnan(mask).any() or np.isposinf(mask).any()):
        raise ValueError(f"{name}: an additive mask must hold no NaN or +inf (−inf blocks a key)")
    return mask


def upstream(name, dy, last):
    """The gradient handed to a model's backward: a float array of the shape and dtype of the last
    forward output, ``last = (shape, dtype)`` (None: no forward pass yet, RuntimeError); returned."""
    if last is None:
        raise RuntimeError("backward: no forward pass to differentiate; call forward first")
    shape, dtype = last
    float_array(name, dy)
    if dy.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} (the last forward output's), "
                         f"got {dy.shape}")
    if dy.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype).name} (the last forward "
                        f"output's), got {dy.dtype}")
    return dy
