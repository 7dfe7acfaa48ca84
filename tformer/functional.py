"""Every kernel of the book, one ``*_forward`` / ``*_backward`` pair per equation (``F`` in the notebooks).

Convention: ``y, cache = name_forward(x, ...)`` and ``grads = name_backward(dy, cache)``, where
``grads`` holds one gradient per differentiable input, in the order of the forward's arguments
(a single array when there is one). The losses return ``(loss, dprediction)``. Each kernel lives in
its own file under ``tformer/kernels/``; this module only gathers them.
"""
from .kernels.activations import (gelu_backward, gelu_forward, relu_backward, relu_forward,
                                  sigmoid_backward, sigmoid_forward, swish_backward, swish_forward)
from . import _attention_checks as _attn_checks
from .fast import attention as _fast_attention
from .kernels import attention as _attention
from .kernels.dropout import dropout_backward, dropout_forward
from .kernels.embedding import embedding_backward, embedding_forward
from .kernels.flash_attention import flash_attention_backward, flash_attention_forward
from .kernels.layernorm import layernorm_backward, layernorm_forward
from .fast import linear as _fast_linear
from ._validate import float_array, same_dtype   # linear's checks
import numpy as np
from .kernels.losses import cross_entropy, mse_loss
from .kernels.positional import sinusoidal_positions
from .kernels.rmsnorm import rmsnorm_backward, rmsnorm_forward
from .kernels.rope import rope_angles, rope_backward, rope_forward
from .kernels.softmax import softmax_backward, softmax_forward
from .kernels.swiglu import swiglu_backward, swiglu_forward

__all__ = [
    "linear_forward", "linear_backward", "embedding_forward", "embedding_backward",
    "softmax_forward", "softmax_backward", "relu_forward", "relu_backward",
    "sigmoid_forward", "sigmoid_backward", "swish_forward", "swish_backward",
    "gelu_forward", "gelu_backward", "layernorm_forward", "layernorm_backward",
    "dropout_forward", "dropout_backward", "attention_forward", "attention_backward",
    "flash_attention_forward", "flash_attention_backward",
    "causal_mask", "padding_mask", "create_padding_mask", "split_heads", "merge_heads",
    "mse_loss", "cross_entropy", "sinusoidal_positions",
    "rmsnorm_forward", "rmsnorm_backward", "rope_forward", "rope_backward", "rope_angles",
    "swiglu_forward", "swiglu_backward",
]


# --- linear: the arguments checked once, then the fast kernel -----------------------------------

def linear_forward(x, W, b=None, out=None):
    """Y = X W + b (``tformer.kernels.linear.linear_forward``), checked, computed by
    ``tformer.fast.linear.linear_forward``. ``out``: a C-contiguous array of y's shape and W's
    dtype to write y into. Returns ``y, cache``."""
    _check_linear(x, W, b, out)
    return _fast_linear.linear_forward(x, W, b, out)


def linear_backward(dy, cache, accumulate=None):
    """dX = dY Wᵀ, dW = Xᵀ dY, db = Σ_rows dY (``tformer.kernels.linear.linear_backward``), checked,
    computed by ``tformer.fast.linear.linear_backward``. ``accumulate=(gW, gb)``: add dW and db
    into these arrays and return them in place of dW and db."""
    x, W, has_b = cache
    if dy.shape != (*x.shape[:-1], W.shape[1]):
        raise ValueError(f"dy: expected shape {(*x.shape[:-1], W.shape[1])}, got {dy.shape}")
    if accumulate is not None:
        gW, gb = accumulate
        if gW.shape != W.shape or (has_b and (gb is None or gb.shape != (W.shape[1],))):
            raise ValueError(f"accumulate: expected arrays of shapes {W.shape} and ({W.shape[1]},), got "
                             f"{gW.shape} and {None if gb is None else gb.shape}")
    return _fast_linear.linear_backward(dy, cache, accumulate)


def _check_linear(x, W, b, out):
    float_array("x", x, min_ndim=1)
    float_array("W", W, ndim=2)
    if x.shape[-1] != W.shape[0]:
        raise ValueError(f"x: last axis must match W's first: x {x.shape}, W {W.shape}")
    if b is not None:
        float_array("b", b, ndim=1)
        if b.shape[0] != W.shape[1]:
            raise ValueError(f"b: expected shape ({W.shape[1]},), got {b.shape}")
    same_dtype(x=x, W=W, b=b)
    shape = (*x.shape[:-1], W.shape[1])
    if out is not None and (not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != W.dtype
                            or not out.flags.c_contiguous):
        raise ValueError(f"out: expected a C-contiguous {W.dtype} array of shape {shape}, got "
                         f"{getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}")


# --- attention: the arguments checked once, then the fast kernel --------------------------------

def attention_forward(q, k, v, mask=None, scale=None, is_causal=False, out=None):
    """Y = softmax(scale · Q Kᵀ + M) V (``tformer.kernels.attention.attention_forward``), checked,
    computed by ``tformer.fast.attention.attention_forward``: grouped-query heads (k, v with H_kv
    heads on axis −3), ``is_causal=True`` (the causal mask, its masked tiles skipped), ``out=``.
    Returns ``y, cache``; ``cache.P`` holds the probabilities."""
    _attn_checks.check_attention(q, k, v, mask, is_causal, out)
    return _fast_attention.attention_forward(q, k, v, mask, scale, is_causal, out)


def attention_backward(dy, cache, out=None):
    """dQ, dK, dV (``tformer.kernels.attention.attention_backward``), checked, computed by
    ``tformer.fast.attention.attention_backward``; ``out=(dq, dk, dv)``: arrays to write into."""
    _attn_checks.check_attention_backward(dy, cache, out)
    return _fast_attention.attention_backward(dy, cache, out)


def causal_mask(T_q, T_k=None):
    """``tformer.kernels.attention.causal_mask``, checked: (T_q, T_k) boolean, True = may attend."""
    _attn_checks.check_causal_mask(T_q, T_k)
    return _attention.causal_mask(T_q, T_k)


def padding_mask(tokens, pad_idx=0):
    """``tformer.kernels.attention.padding_mask``, checked: (B, T) tokens -> (B, 1, 1, T) boolean."""
    _attn_checks.check_tokens(tokens)
    return _attention.padding_mask(tokens, pad_idx)


create_padding_mask = padding_mask


def split_heads(x, n_heads):
    """``tformer.kernels.attention.split_heads``, checked: (B, T, C) -> (B, H, T, D), a view."""
    _attn_checks.check_split_heads(x, n_heads)
    return _attention.split_heads(x, n_heads)


def merge_heads(x):
    """``tformer.kernels.attention.merge_heads``, checked: (B, H, T, D) -> (B, T, H·D)."""
    _attn_checks.check_heads(x)
    return _attention.merge_heads(x)
