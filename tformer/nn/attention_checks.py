"""The checks of attention's arguments, made once where input enters (``tformer.nn.functional``),
shared by the plain kernel (``F.attention_forward``) and the online softmax
(``F.flash_attention_forward``). The kernels underneath check nothing."""
import numpy as np

from tformer.core.validate import float_array, int_array, same_dtype


def check_qkv(q, k, v):
    """The attention inputs: float arrays of one dtype and one rank ≥ 2, D_q = D_k, T_k = T_v, leading
    axes that agree (but for the head axis of grouped-query attention). Returns G = H / H_kv."""
    float_array("q", q, min_ndim=2)
    float_array("k", k, min_ndim=2)
    float_array("v", v, min_ndim=2)
    same_dtype(q=q, k=k, v=v)
    if not (q.ndim == k.ndim == v.ndim):
        raise ValueError(f"q, k, v: expected the same rank, got {q.shape}, {k.shape}, {v.shape}")
    G = _group_size(q, k, v)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k: expected key size D = {q.shape[-1]} (from q), got shape {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"v: expected {k.shape[-2]} positions (from k), got shape {v.shape}")
    return G


def _group_size(q, k, v):
    """G = H / H_kv, the query heads per key/value head (1 when q, k, v have the same leading axes).

    Checks that the leading axes agree except, for grouped-query attention, the head axis −3."""
    if k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"k, v: leading axes differ: {k.shape}, {v.shape}")
    if q.shape[:-2] == k.shape[:-2]:
        return 1
    if q.ndim < 3 or q.shape[:-3] != k.shape[:-3]:
        raise ValueError(f"q, k, v: leading axes differ: {q.shape}, {k.shape}, {v.shape} (only the "
                         "head axis −3 may differ, for grouped-query attention)")
    H, H_kv = q.shape[-3], k.shape[-3]
    if H_kv < 1 or H % H_kv:
        raise ValueError(f"k: grouped-query attention needs H = {H} query heads to be a multiple of "
                         f"the key/value heads H_kv, got H_kv = {H_kv} (q {q.shape}, k {k.shape})")
    return H // H_kv


def check_attention(q, k, v, mask, is_causal, out):
    """``attention_forward``'s arguments: q, k, v (``check_qkv``), the mask (a boolean or float array
    broadcasting to the scores), ``is_causal`` (no mask with it, T_q = T_k) and ``out``."""
    check_qkv(q, k, v)
    if is_causal:
        if mask is not None:
            raise ValueError("mask: must be None when is_causal=True (combine the masks instead)")
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(f"is_causal: needs T_q = T_k, got q {q.shape} and k {k.shape}")
    if mask is not None:
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"mask: expected a boolean or float NumPy array, got {type(mask).__name__}")
        scores = (*q.shape[:-1], k.shape[-2])
        try:
            np.broadcast_shapes(mask.shape, scores)
        except ValueError:
            raise ValueError(f"mask: shape {mask.shape} does not broadcast to scores {scores}") from None
        if mask.dtype != bool and not np.issubdtype(mask.dtype, np.floating):
            raise TypeError(f"mask: expected dtype bool or float, got {mask.dtype}")
    _out("out", out, (*q.shape[:-1], v.shape[-1]), q.dtype)


def check_attention_backward(dy, cache, out):
    """``attention_backward``'s arguments: dy shaped like y, and ``out`` three arrays like q, k, v."""
    q, k, v = cache[:3]
    if dy.shape != (*q.shape[:-1], v.shape[-1]):
        raise ValueError(f"dy: expected shape {(*q.shape[:-1], v.shape[-1])}, got {dy.shape}")
    if out is not None:
        if len(out) != 3:
            raise ValueError(f"out: expected three arrays (dq, dk, dv), got {len(out)}")
        for i, (n, like) in enumerate(zip("qkv", (q, k, v))):
            _out(f"out[{i}] (d{n})", out[i], like.shape, like.dtype)


def check_flash(q, k, v, mask, is_causal, out, block_q, block_k):
    """``flash_attention_forward``'s arguments: as ``check_attention``, but ``is_causal`` may come
    with a mask and needs only T_k ≥ T_q; the tile sizes positive integers."""
    check_qkv(q, k, v)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal: expected True or False, got {is_causal!r}")
    if is_causal and k.shape[-2] < q.shape[-2]:
        raise ValueError(f"is_causal: needs T_k ≥ T_q (the queries are the last T_q positions), "
                         f"got q {q.shape} and k {k.shape}")
    scores = (*q.shape[:-1], k.shape[-2])                               # (..., T_q, T_k)
    if mask is not None:
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"mask: expected a boolean or float NumPy array, got {type(mask).__name__}")
        try:
            np.broadcast_shapes(mask.shape, scores)
        except ValueError:
            raise ValueError(f"mask: shape {mask.shape} does not broadcast to scores {scores}") from None
        if mask.ndim > len(scores):
            raise ValueError(f"mask: shape {mask.shape} has more axes than the scores {scores}")
        if mask.dtype != bool and not np.issubdtype(mask.dtype, np.floating):
            raise TypeError(f"mask: expected dtype bool or float, got {mask.dtype}")
    for name, value in (("block_q", block_q), ("block_k", block_k)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                  or value < 1):
            raise ValueError(f"{name}: expected a positive integer tile size, got {value!r}")
    _out("out", out, (*q.shape[:-1], v.shape[-1]), q.dtype)


def check_flash_backward(dy, cache, out):
    """``flash_attention_backward``'s arguments: dy a float array shaped like y, ``out`` three
    arrays like q, k, v."""
    float_array("dy", dy, min_ndim=2)
    if dy.shape != cache.y.shape:
        raise ValueError(f"dy: expected shape {cache.y.shape}, got {dy.shape}")
    if out is not None:
        if len(out) != 3:
            raise ValueError(f"out: expected three arrays (dq, dk, dv), got {len(out)}")
        for i, (n, like) in enumerate(zip("qkv", (cache.q, cache.k, cache.v))):
            _out(f"out[{i}] (d{n})", out[i], like.shape, like.dtype)


def _out(name, out, shape, dtype):
    """``out`` checked against the shape and dtype it must have, or a new array."""
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray) or out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"{name}: expected a {np.dtype(dtype)} array of shape {tuple(shape)}, got "
                         f"{getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}")
    return out


def check_split_heads(x, n_heads):
    float_array("x", x, ndim=3)
    if n_heads < 1 or x.shape[2] % n_heads:
        raise ValueError(f"n_heads: must divide C = {x.shape[2]}, got {n_heads}")


def check_causal_mask(T_q, T_k):
    if T_k is not None and T_k < T_q:
        raise ValueError(f"T_k: expected at least T_q = {T_q} keys, got {T_k}")


def check_tokens(tokens):
    int_array("tokens", tokens, ndim=2)


def check_heads(x):
    float_array("x", x, ndim=4)
