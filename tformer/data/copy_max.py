"""The single attention layer's task: copy the row whose first feature is largest to every output position.

    j*_b = argmax_t X[b, t, 0],      Y_true[b, t, :] = X[b, j*_b, :]   for every t

Inputs are drawn i.i.d. from U(0, 1) (the distribution of C's ``rand() / RAND_MAX``). The positive
mean matters for the single attention layer: it has no biases, so its score ``x_i W_q W_kᵀ x_jᵀ``
can only favour a large ``x_j0`` for *every* query ``x_i`` if the queries share a common
direction; with zero-mean inputs half of the queries would look for the minimum instead.

Batches are pure functions of ``(seed, split, index)``: ``np.random.default_rng([seed, split, index])``,
with split 0 for training and 1 for held-out evaluation, so the two never share a batch and a
resumed run sees the same data.

Accuracy (``nearest_row_accuracy``): the share of output rows ``Y[b, t]`` whose nearest input row
(Euclidean distance among the T rows of ``X[b]``) is the correct one, ``X[b, j*_b]``.
"""
import numpy as np

from tformer.nn import functional as F
from tformer.core.validate import float_array, int_array

SPLITS = {"train": 0, "test": 1}


def argmax_rows(x):
    """j*_b = argmax_t x[b, t, 0]:  ``x: (B, T, d)`` -> ``(B,)`` integer positions."""
    float_array("x", x, ndim=3)
    return np.argmax(x[:, :, 0], axis=1)


def copy_max_targets(x):
    """Y_true[b, t] = x[b, j*_b] for every t:  ``x: (B, T, d)`` -> ``(B, T, d)``."""
    j = argmax_rows(x)                                          # (B,)
    rows = x[np.arange(x.shape[0]), j]                          # (B, d)
    return np.ascontiguousarray(np.broadcast_to(rows[:, None, :], x.shape))   # (B, T, d)


def copy_max_batch(index, *, batch_size=32, seq_len=8, d_model=16, seed=0, split="train",
                   dtype=np.float32):
    """Batch ``index`` of the copy-max task: ``(x, y_true)``, both ``(batch_size, seq_len, d_model)``.

    ``x ~ U(0, 1)`` from ``np.random.default_rng([seed, split, index])``; ``y_true = copy_max_targets(x)``.
    """
    rng = batch_rng(index, seed, split, batch_size=batch_size, seq_len=seq_len, d_model=d_model)
    x = rng.random((batch_size, seq_len, d_model)).astype(dtype)    # (B, T, d)
    return x, copy_max_targets(x)


def batch_rng(index, seed, split, **sizes):
    """The generator of batch ``index``: ``default_rng([seed, split, index])``, after checking the arguments."""
    _check_sizes(**sizes)
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {sorted(SPLITS)}, got {split!r}")
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
        raise ValueError(f"index: expected an integer ≥ 0, got {index!r}")
    return np.random.default_rng([seed, SPLITS[split], int(index)])


def nearest_rows(y, candidates):
    """n[b, t] = argmin_j ‖y[b, t] − candidates[b, j]‖:  ``(B, T, d)``, ``(B, J, d)`` -> ``(B, T)``."""
    float_array("y", y, ndim=3)
    float_array("candidates", candidates, ndim=3)
    if y.shape[0] != candidates.shape[0] or y.shape[2] != candidates.shape[2]:
        raise ValueError(f"candidates: expected shape ({y.shape[0]}, J, {y.shape[2]}) to match y "
                         f"{y.shape}, got {candidates.shape}")
    y64, c64 = y.astype(np.float64), candidates.astype(np.float64)
    # ‖y − c‖² = ‖y‖² − 2 y·c + ‖c‖²; ‖y‖² is the same for every candidate, so it is left out
    d2 = (c64 * c64).sum(-1)[:, None, :] - 2.0 * (y64 @ c64.swapaxes(1, 2))   # (B, T, J)
    return np.argmin(d2, axis=-1)


def nearest_row_accuracy(y, candidates, correct):
    """Share of output rows whose nearest candidate row is ``correct[b]``.

    ``y: (B, T, d)`` model outputs, ``candidates: (B, J, d)`` the rows to choose from (for copy-max,
    the input rows), ``correct: (B,)`` the index of the right row. Returns a float in [0, 1].
    """
    int_array("correct", correct, ndim=1)
    if correct.shape[0] != y.shape[0]:
        raise ValueError(f"correct: expected shape ({y.shape[0]},), got {correct.shape}")
    return float(np.mean(nearest_rows(y, candidates) == correct[:, None]))


def half_sum_loss(model, batch):
    """The objective of the single attention layer and the two-layer transformer, as
    ``tformer.training.train.train`` wants it: ``(L, ∂L/∂Y)`` with L = ½‖Y − Y_true‖² summed over the batch
    and ∂L/∂Y = Y − Y_true, for ``batch = (x, y_true)``."""
    x, y_true = batch[0], batch[1]
    return F.mse_loss(model.forward(x), y_true, reduction="half_sum")


def held_out(n_batches=8, *, batch_size=64, seq_len=8, d_model=16, seed=0, dtype=np.float32,
             make_batch=None):
    """The held-out set: test batches ``0 .. n_batches-1`` of ``make_batch`` (default ``copy_max_batch``)."""
    make_batch = copy_max_batch if make_batch is None else make_batch
    return [make_batch(i, batch_size=batch_size, seq_len=seq_len, d_model=d_model, seed=seed,
                       split="test", dtype=dtype) for i in range(n_batches)]


def evaluate(model, batches):
    """Loss and accuracy of ``model`` on ``batches``, a list of ``(x, y_true)`` (e.g. ``held_out()``).

    Returns ``{"loss": ½‖Y − Y_true‖² per sequence (mean over sequences), "accuracy": share of output
    rows nearest the right input row, "seq_accuracy": share of sequences with every row right}``.
    """
    loss = hits = rows = seqs = n_seq = 0.0
    for x, y_true in batches:
        y = model.forward(x)
        diff = (y - y_true).astype(np.float64)
        loss += 0.5 * float(np.vdot(diff, diff))
        hit = nearest_rows(y, x) == argmax_rows(x)[:, None]        # (B, T)
        hits += float(hit.sum())
        rows += hit.size
        seqs += float(hit.all(axis=1).sum())
        n_seq += hit.shape[0]
    if not n_seq:
        raise ValueError("batches: expected at least one (x, y_true) batch, got none")
    return {"loss": loss / n_seq, "accuracy": hits / rows, "seq_accuracy": seqs / n_seq}


def _check_sizes(**sizes):
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
