"""The two-layer transformer's second task: copy-max on zero-mean inputs, where the MLP is needed.

    x ~ N(0, 1) i.i.d.,   j*_b = argmax_t X[b, t, 0],   Y_true[b, t, :] = X[b, j*_b, :]

The rule is the single attention layer's (``copy_max``); only the inputs change, from U(0, 1) to a distribution that
is symmetric about zero. That makes every bias-free network built of attention and linear maps
fail, and a swish MLP succeed:

- Attention scores are bilinear, S = X W_q W_kᵀ Xᵀ / √d, so S(−X) = S(X) and A(−X) = A(X); the
  values are linear, so Attn(−X) = −Attn(X). Residual sums of odd maps are odd: without the MLP,
  Y(−X) = −Y(X).
- The target is not odd: the first feature of −X is largest where that of X is *smallest*, so
  Y_true(−X) = −X[argmin] while −Y_true(X) = −X[argmax].
- X and −X are equally likely, and an odd model that outputs the right row for X outputs the
  negation of that row for −X, the wrong one (the right one is −X[argmin]). Each output row is
  right for at most one of X and −X, so its expected accuracy is at most one half.
- swish(h) = h σ(h) is not odd (swish(h) − swish(−h) = h, but swish(h) + swish(−h) = h tanh(h/2) ≥ 0),
  so the two-layer transformer can break the symmetry, and it learns the task.

Batches are pure functions of ``(seed, split, index)``, as in ``copy_max``; evaluate with
``copy_max.evaluate(model, held_out())``.
"""
import numpy as np

from tformer.data.copy_max import batch_rng, copy_max_targets
from tformer.data.copy_max import held_out as _held_out


def centered_copy_max_batch(index, *, batch_size=32, seq_len=8, d_model=16, seed=0, split="train",
                            dtype=np.float32):
    """Batch ``index``: ``(x, y_true)``, both ``(batch_size, seq_len, d_model)``, ``x ~ N(0, 1)``.

    Drawn from ``np.random.default_rng([seed, split, index])`` (the same streams as
    ``copy_max_batch``, which draws U(0, 1) instead); ``y_true = copy_max_targets(x)``.
    """
    rng = batch_rng(index, seed, split, batch_size=batch_size, seq_len=seq_len, d_model=d_model)
    x = rng.standard_normal((batch_size, seq_len, d_model)).astype(dtype)    # (B, T, d)
    return x, copy_max_targets(x)


def held_out(n_batches=8, *, batch_size=64, seq_len=8, d_model=16, seed=0, dtype=np.float32):
    """The held-out set: test batches ``0 .. n_batches-1`` of ``centered_copy_max_batch``."""
    return _held_out(n_batches, batch_size=batch_size, seq_len=seq_len, d_model=d_model, seed=seed,
                     dtype=dtype, make_batch=centered_copy_max_batch)
