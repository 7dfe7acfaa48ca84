"""Every kernel of the book, one ``*_forward`` / ``*_backward`` pair per equation (``F`` in the notebooks).

Convention: ``y, cache = name_forward(x, ...)`` and ``grads = name_backward(dy, cache)``, where
``grads`` holds one gradient per differentiable input, in the order of the forward's arguments
(a single array when there is one). The losses return ``(loss, dprediction)``. Each kernel, the
chapter's equation, lives in its own file under ``tformer/kernels/``; a function here checks its
arguments once (the boundary) and then calls the faster version of the kernel in ``tformer/fast/``,
which a test holds equal to it.

``F`` is the entry point of a caller who hands a kernel arrays it has not checked: a notebook, a
loss, a data task. The layers are the other kind of caller: a model checks its input once where it
enters, so every layer calls ``tformer.fast`` directly (and the few checks that depend on a layer's
own arguments, an attention mask, from ``tformer.nn.attention_checks``); none calls ``F``.
"""
import numpy as np

from tformer.nn import attention_checks as _attn_checks
from tformer.core.dtypes import is_low
from tformer.core.validate import float_array, index_range, int_array, same_dtype
from tformer.fast import activations as _fast_act
from tformer.fast import attention as _fast_attention
from tformer.fast import dropout as _fast_dropout
from tformer.fast import embedding as _fast_emb
from tformer.fast import layernorm as _fast_ln
from tformer.fast import linear as _fast_linear
from tformer.fast import losses as _fast_losses
from tformer.fast import rmsnorm as _fast_rms
from tformer.fast import rope as _fast_rope
from tformer.fast import softmax as _fast_softmax
from tformer.fast import swiglu as _fast_swiglu
from tformer.kernels import attention as _attention
from tformer.fast import flash_attention as _flash
# The fixed positions: no faster version, its own boundary. The modern block's kernels (RMSNorm,
# RoPE, SwiGLU): checked below, then their fast versions; rope_angles checks its own arguments.
from tformer.kernels.positional import sinusoidal_positions
from tformer.kernels import rope as _rope
from tformer.kernels.rope import _check_base, _positions

__all__ = [
    "linear_forward", "linear_backward", "embedding_forward", "embedding_backward",
    "softmax_forward", "softmax_backward", "relu_forward", "relu_backward",
    "relu2_forward", "relu2_backward",
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


# --- softmax, activations, layernorm, losses, dropout, embedding: checked once, then fast -------

def softmax_forward(x, axis=-1):
    """s = softmax(x) along ``axis`` (``tformer.kernels.softmax.softmax_forward``), checked, computed
    by ``tformer.fast.softmax.softmax_forward``. Returns ``s, cache``."""
    float_array("x", x, min_ndim=1)
    return _fast_softmax.softmax_forward(x, axis)


def softmax_backward(ds, cache):
    """dx = s ⊙ (ds − ⟨ds, s⟩) (``tformer.kernels.softmax.softmax_backward``), checked, fast."""
    _upstream_shape("ds", ds, cache.s.shape)
    return _fast_softmax.softmax_backward(ds, cache)


def _upstream_shape(name, dy, shape):
    if dy.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {dy.shape}")


def relu_forward(x):
    """y = max(0, x) (``tformer.kernels.activations.relu_forward``), checked. Returns ``y, cache``."""
    float_array("x", x)
    return _fast_act.relu_forward(x)


def relu_backward(dy, cache):
    """dx = dy ⊙ 1[x > 0] (``tformer.kernels.activations.relu_backward``), checked."""
    _upstream_shape("dy", dy, cache.shape)
    return _fast_act.relu_backward(dy, cache)


def relu2_forward(x):
    """y = max(0, x)² (``tformer.kernels.activations.relu2_forward``), checked. Returns ``y, cache``."""
    float_array("x", x)
    return _fast_act.relu2_forward(x)


def relu2_backward(dy, cache):
    """dx = dy ⊙ 2 max(0, x) (``tformer.kernels.activations.relu2_backward``), checked."""
    _upstream_shape("dy", dy, cache.shape)
    return _fast_act.relu2_backward(dy, cache)


def sigmoid_forward(x):
    """σ(x) = ½(1 + tanh(x/2)) (``tformer.kernels.activations.sigmoid_forward``), checked, computed by
    ``tformer.fast.activations.sigmoid_forward``. Returns ``y, cache``."""
    float_array("x", x)
    return _fast_act.sigmoid_forward(x)


def sigmoid_backward(dy, cache):
    """dx = dy ⊙ σ(1 − σ) (``tformer.kernels.activations.sigmoid_backward``), checked."""
    _upstream_shape("dy", dy, cache.shape)
    return _fast_act.sigmoid_backward(dy, cache)


def swish_forward(h):
    """h ⊙ σ(h) (``tformer.kernels.activations.swish_forward``), checked, computed by
    ``tformer.fast.activations.swish_forward``. Returns ``y, cache``."""
    float_array("x", h)
    return _fast_act.swish_forward(h)


def swish_backward(dy, cache):
    """dh = dy ⊙ [σ + h σ (1 − σ)] (``tformer.kernels.activations.swish_backward``), checked."""
    _upstream_shape("dy", dy, cache.h.shape)
    return _fast_act.swish_backward(dy, cache)


def gelu_forward(x, approximate="tanh"):
    """GELU(x) = x Φ(x) (``tformer.kernels.activations.gelu_forward``), checked, computed by
    ``tformer.fast.activations.gelu_forward``. Returns ``y, cache``."""
    float_array("x", x)
    if approximate not in ("tanh", "none"):
        raise ValueError(f"approximate: expected 'tanh' or 'none', got {approximate!r}")
    return _fast_act.gelu_forward(x, approximate)


def gelu_backward(dy, cache, out=None):
    """dx = dy ⊙ GELU'(x) (``tformer.kernels.activations.gelu_backward``), checked, fast.
    ``out``: an array of x's shape to write dx into (it may be ``dy`` itself)."""
    x = cache.x
    _upstream_shape("dy", dy, x.shape)
    if out is not None and cache.approximate == "tanh" and not is_low(x.dtype) and (
            out.shape != x.shape or out.dtype != x.dtype or not out.flags.c_contiguous):
        raise ValueError(f"out: expected a C-contiguous {x.dtype} array of shape {x.shape}, "
                         f"got {out.dtype} {out.shape}")
    return _fast_act.gelu_backward(dy, cache, out)


def layernorm_forward(x, gamma, beta, eps=1e-5):
    """y = γ ⊙ (x − μ)·rstd + β (``tformer.kernels.layernorm.layernorm_forward``), checked,
    computed by ``tformer.fast.layernorm.layernorm_forward``. Returns ``y, cache``."""
    _check_layernorm(x, gamma, beta, eps)
    return _fast_ln.layernorm_forward(x, gamma, beta, eps)


def layernorm_backward(dy, cache):
    """(dx, dγ, dβ) (``tformer.kernels.layernorm.layernorm_backward``), checked, fast."""
    _upstream_shape("dy", dy, cache.x.shape)
    return _fast_ln.layernorm_backward(dy, cache)


def _check_layernorm(x, gamma, beta, eps):
    float_array("x", x, min_ndim=1)
    C = x.shape[-1]
    for name, p in (("gamma", gamma), ("beta", beta)):
        float_array(name, p, ndim=1)
        if p.shape != (C,):
            raise ValueError(f"{name}: expected shape ({C},), got {p.shape}")
    same_dtype(x=x, gamma=gamma, beta=beta)
    if not eps > 0:
        raise ValueError(f"eps: expected a positive number, got {eps}")


def dropout_forward(x, p, rng=None, training=True):
    """y = x ⊙ m / (1 − p) (``tformer.kernels.dropout.dropout_forward``), checked, computed by
    ``tformer.fast.dropout.dropout_forward``. Returns ``y, cache``."""
    _check_dropout(x, p, rng, training)
    return _fast_dropout.dropout_forward(x, p, rng, training)


def dropout_backward(dy, cache):
    """dx = dy ⊙ m / (1 − p) (``tformer.kernels.dropout.dropout_backward``), checked, fast."""
    if cache is not None:
        _upstream_shape("dy", dy, cache.shape)
    return _fast_dropout.dropout_backward(dy, cache)


def _check_dropout(x, p, rng, training):
    float_array("x", x)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p: expected a drop probability in [0, 1), got {p}")
    if training and p != 0.0 and not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected np.random.Generator, got {type(rng).__name__}")


def embedding_forward(tokens, W):
    """E = W[tokens] (``tformer.kernels.embedding.embedding_forward``), checked. Returns ``E, cache``."""
    int_array("tokens", tokens)
    float_array("W", W, ndim=2)
    index_range("tokens", tokens, 0, W.shape[0])
    return _fast_emb.embedding_forward(tokens, W)


def embedding_backward(dE, cache):
    """dW[v] = Σ_{tokens = v} dE (``tformer.kernels.embedding.embedding_backward``), checked,
    computed by ``tformer.fast.embedding.embedding_backward``."""
    tokens, (V, C) = cache
    _upstream_shape("dE", dE, (*tokens.shape, C))
    return _fast_emb.embedding_backward(dE, cache)


def mse_loss(y, target, reduction="mean"):
    """(L, dL/dy) of the squared error (``tformer.kernels.losses.mse_loss``), checked, computed by
    ``tformer.fast.losses.mse_loss``."""
    float_array("y", y)
    float_array("target", target)
    if y.shape != target.shape:
        raise ValueError(f"target: expected shape {y.shape} (from y), got {target.shape}")
    if reduction == "mean" and y.size == 0:
        raise ValueError(f"y: reduction='mean' needs at least one element (a mean over none is "
                         f"undefined), got shape {y.shape}; 'sum' and 'half_sum' give 0")
    if reduction not in ("mean", "half_sum", "sum"):
        raise ValueError(f"reduction: expected 'mean', 'half_sum' or 'sum', got {reduction!r}")
    return _fast_losses.mse_loss(y, target, reduction)


def cross_entropy(logits, targets, ignore_index=None):
    """(L, dL/dz) of the mean cross-entropy (``tformer.kernels.losses.cross_entropy``), checked,
    computed by ``tformer.fast.losses.cross_entropy``."""
    _check_cross_entropy(logits, targets, ignore_index)
    return _fast_losses.cross_entropy(logits, targets, ignore_index)


def _check_cross_entropy(logits, targets, ignore_index):
    float_array("logits", logits, min_ndim=1)
    int_array("targets", targets)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets: expected shape {logits.shape[:-1]} (from logits {logits.shape}), "
                         f"got {targets.shape}")
    index_range("targets", targets, 0, logits.shape[-1], ignore=ignore_index)


# --- the online softmax: the arguments checked once, then the kernel ------------------------------

def flash_attention_forward(q, k, v, mask=None, scale=None, is_causal=False, out=None,
                            block_q=None, block_k=None):
    """Y = softmax(scale · Q Kᵀ + M) V by the online softmax
    (``tformer.fast.flash_attention.flash_attention_forward``), its arguments checked first.
    Returns ``y, cache``."""
    _attn_checks.check_flash(q, k, v, mask, is_causal, out, block_q, block_k)
    return _flash.flash_attention_forward(q, k, v, mask, scale, is_causal, out, block_q, block_k)


def flash_attention_backward(dy, cache, out=None):
    """dQ, dK, dV of the online softmax (``tformer.fast.flash_attention.flash_attention_backward``),
    its arguments checked first; ``out=(dq, dk, dv)``: arrays to write into."""
    _attn_checks.check_flash_backward(dy, cache, out)
    return _flash.flash_attention_backward(dy, cache, out)


# --- the modern block: RMSNorm, RoPE, SwiGLU, checked once, then fast -----------------------------

def rmsnorm_forward(x, gamma, eps=1e-6):
    """y = γ ⊙ x · rstd (``tformer.kernels.rmsnorm.rmsnorm_forward``), checked, computed by
    ``tformer.fast.rmsnorm.rmsnorm_forward``. Returns ``y, cache``."""
    float_array("x", x, min_ndim=1)
    C = x.shape[-1]
    float_array("gamma", gamma, ndim=1)
    if gamma.shape != (C,):
        raise ValueError(f"gamma: expected shape ({C},), got {gamma.shape}")
    same_dtype(x=x, gamma=gamma)
    if not eps > 0:
        raise ValueError(f"eps: expected a positive number, got {eps}")
    return _fast_rms.rmsnorm_forward(x, gamma, eps)


def rmsnorm_backward(dy, cache):
    """(dx, dγ) (``tformer.kernels.rmsnorm.rmsnorm_backward``), checked, fast."""
    _upstream_shape("dy", dy, cache.x.shape)
    return _fast_rms.rmsnorm_backward(dy, cache)


def rope_forward(x, positions=None, base=10000.0):
    """y = R(φ) x, pairs of channels rotated by φᵢ = p · base^(−2i/D)
    (``tformer.kernels.rope.rope_forward``), checked, computed by ``tformer.fast.rope.rope_forward``.
    ``positions``: ``None`` (0 … T−1), an integer offset o ≥ 0 (o … o+T−1) or a finite ``(T,)``
    array. Returns ``y, cache``."""
    float_array("x", x, min_ndim=2)
    T, D = x.shape[-2:]
    if D < 2 or D % 2:
        raise ValueError(f"x: expected an even last axis D (pairs of channels), got shape {x.shape}")
    positions = _positions(positions, T)
    return _fast_rope.rope_forward(x, positions, _check_base(base))


def rope_backward(dy, cache, out=None):
    """dx = R(−φ) dy (``tformer.kernels.rope.rope_backward``), checked, fast. ``out``: an array of
    dy's shape and dtype to write dx into (it may be ``dy`` itself)."""
    shape = cache.shape
    _upstream_shape("dy", dy, shape)
    if out is not None and (not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dy.dtype):
        raise ValueError(f"out: expected a {dy.dtype} array of shape {shape}, got "
                         f"{getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}")
    return _fast_rope.rope_backward(dy, cache, out)


def swiglu_forward(a, b):
    """y = silu(a) ⊙ b (``tformer.kernels.swiglu.swiglu_forward``), checked, computed by
    ``tformer.fast.swiglu.swiglu_forward``. Returns ``y, cache``."""
    float_array("a", a)
    float_array("b", b)
    if a.shape != b.shape:
        raise ValueError(f"b: expected the shape of a, {a.shape}, got {b.shape}")
    same_dtype(a=a, b=b)
    return _fast_swiglu.swiglu_forward(a, b)


def swiglu_backward(dy, cache, out=None):
    """(da, db) (``tformer.kernels.swiglu.swiglu_backward``), checked, fast. ``out=(da, db)``: two
    arrays of a's shape and dtype to write the gradients into (neither may overlap ``dy``)."""
    a = cache.a
    _upstream_shape("dy", dy, a.shape)
    if out is not None and (len(out) != 2 or any(
            not isinstance(o, np.ndarray) or o.shape != a.shape or o.dtype != a.dtype for o in out)):
        raise ValueError(f"out: expected two {a.dtype} arrays (da, db) of shape {a.shape}")
    return _fast_swiglu.swiglu_backward(dy, cache, out)


def rope_angles(positions, D, base=10000.0):
    """φ[t, i] = p_t · θ_i,  θ_i = base^(−2i/D),  i = 0 … D/2 − 1 (``tformer.kernels.rope.rope_angles``,
    which checks D and base). Shapes: ``positions: (T,)`` -> ``(cos φ, sin φ)``, each ``(T, D/2)``
    float64."""
    return _rope.rope_angles(positions, D, base)
