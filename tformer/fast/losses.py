"""Losses, faster: mean squared error and cross-entropy, each with its gradient.

Equal to ``tformer.kernels.losses`` (``tests/test_fast_losses.py``). ``cross_entropy`` is the one
that matters (every training step of a token model): softmax, log, the target's pick and the
gradient fused into one pass over each block of rows, the rows split across threads
(``parallel.parallel_for``), each row shifted by its target's own logit (no reduction over V to
find the maximum) and the row sums taken by BLAS. float16/bfloat16 logits are computed in float32.
Non-finite logits raise FloatingPointError.
"""
import numpy as np

from tformer.core import parallel
from tformer.core.dtypes import is_low


def mse_loss(y, target, reduction="mean"):
    """Squared error (``tformer.kernels.losses.mse_loss``: reductions ``"mean"``, ``"half_sum"``,
    ``"sum"``), the sum as one ``vdot``. float16/bfloat16 input: computed in float32, and ``dy`` is
    returned in float32 (see ``cross_entropy``). A non-finite loss raises FloatingPointError.
    """
    if is_low(y.dtype) or is_low(target.dtype):
        return mse_loss(y.astype(np.float32), target.astype(np.float32), reduction)
    diff = y - target
    sq = float(np.vdot(diff, diff))
    if reduction == "mean":
        loss, diff = sq / diff.size, diff * (2.0 / diff.size)
    elif reduction == "half_sum":
        loss = 0.5 * sq
    else:                                                # "sum"
        loss, diff = sq, diff * 2.0
    if not np.isfinite(loss):
        raise FloatingPointError(f"mse_loss: the loss is not finite ({loss}); y holds inf or NaN")
    return loss, diff.astype(y.dtype, copy=False)


def cross_entropy(logits, targets, ignore_index=None):
    """L = (1/N) Σ_n −log p_{n, y_n},  p_n = softmax(z_n);  dL/dz_n = (p_n − onehot(y_n)) / N.

    N counts the targets that are not ``ignore_index`` (padding): ignored positions add nothing to
    the loss and get a zero gradient. Softmax and log are fused: log p = z − m − log Σ e^{z − m},
    so logits of ±1e4 give a finite loss, and the gradient p − onehot never divides by a tiny p.
    If every target is ignored (or there are none: ``logits: (0, V)``), the loss is 0.0 and the
    gradient is zero.
    Shapes: ``logits: (..., V)``, ``targets: (...)`` integers in [0, V)  ->  ``(loss: float, dlogits: like logits)``.
    float16/bfloat16 logits: the loss is computed in float32 and ``dlogits`` is returned in float32.
    Its entries are about p/N, far below float16's smallest normal number for N in the thousands:
    rounded now, most would vanish. Mixed-precision training (``tformer.training.precision``) multiplies it
    by the loss scale first and then rounds it to the model's format.
    """
    if is_low(logits.dtype):
        return cross_entropy(logits.astype(np.float32), targets, ignore_index)
    V = logits.shape[-1]
    z = logits.reshape(-1, V)                            # (N, V)
    t = targets.ravel()                                  # (N,)
    N = z.shape[0]
    valid = np.ones(t.shape, bool) if ignore_index is None else t != ignore_index
    t_safe = np.where(valid, t, 0)
    n = int(valid.sum())
    if n == 0:
        if not np.isfinite(z).all():
            raise FloatingPointError("cross_entropy: logits hold inf or NaN")
        return 0.0, np.zeros_like(logits)
    p = np.empty_like(z)                                 # becomes dL/dz, row block by row block
    nll = np.empty(N)                                    # −log p_y per row, float64
    finite = np.ones(N, bool)
    ones_V = np.ones(V, z.dtype)

    def rows(lo, hi):
        _rows(z[lo:hi], p[lo:hi], t_safe[lo:hi], valid[lo:hi], n, ones_V, nll[lo:hi], finite[lo:hi])

    parallel.parallel_for(rows, N, grain=parallel.grain_for(V))
    if not finite.all():
        raise FloatingPointError("cross_entropy: logits hold inf or NaN")
    loss = float(nll[valid].sum() / n)                   # one whole sum, whatever the thread count
    return loss, p.reshape(logits.shape)


def _rows(zs, ps, ts, valid, n, ones_V, nll, finite):
    """One block of rows: ``ps`` ← (p − onehot)·valid/n, ``nll`` ← −log p_y (float64), ``finite`` ←
    False on rows whose logits hold inf or NaN (then nothing else is written).

    Each row is shifted by m before the exponential (the softmax is the same for any shift: see
    softmax._softmax_shifted_inplace). First by its target's own logit, m = z_y: then
    Σ_j e^{z_j − m} holds e⁰ = 1, is ≥ 1, and needs no reduction over V to find m. Where that does
    not fit (a logit ~88 above the target's overflows, or the logits hold inf or NaN), the block is
    done again by the row maximum, which also reports non-finite logits.
    """
    r = np.arange(len(zs))
    z_y = zs[r, ts][:, None]                             # (rows, 1)
    total = _shifted_exp(zs, ps, z_y, ones_V)
    if total.min() >= 1 and total.max() <= np.finfo(zs.dtype).max:    # NaN fails both
        z_t = 0.0                                        # z_y − m = 0
    else:
        m = zs.max(axis=1, keepdims=True)                # (rows, 1)
        finite[:] = np.isfinite(m[:, 0])
        if not finite.all():
            return                                       # reported by the caller, before anything is used
        total = _shifted_exp(zs, ps, m, ones_V)
        z_t = (z_y - m)[:, 0].astype(np.float64)         # z_y − m ≤ 0
    nll[:] = np.log(total.astype(np.float64)) - z_t      # −log p_y = log Σ e^{z−m} − (z_y − m)
    # (p − onehot)/N on valid rows, 0 elsewhere, with one pass over p: softmax's 1/Σ and the mean's
    # valid/N form one per-row factor (the onehot entry, 1/Σ·e^{z_y−m} − 1, is rescaled the same way).
    factor = (valid / (n * total.astype(np.float64))).astype(ps.dtype)       # (rows,)
    ps[r, ts] -= total                                   # e^{z_y − m} − Σ: times factor gives (p_y − 1)/N
    ps *= factor[:, None]


def _shifted_exp(zs, ps, m, ones_V):
    """ps = e^{zs − m} (rows, V); returns Σ over each row, one BLAS gemv."""
    with np.errstate(over="ignore", invalid="ignore"):
        np.subtract(zs, m, out=ps)
        np.exp(ps, out=ps)
    return ps @ ones_V
