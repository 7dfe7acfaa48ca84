"""Losses, faster: mean squared error and cross-entropy, each with its gradient; log-softmax and a
sequence's log-probability with its gradient (DPO, beam search, the decoding and preference
measurements: every log-probability the package takes outside a training step's loss).

Equal to ``tformer.kernels.losses`` (``tests/kernels/test_fast_losses.py``). ``cross_entropy`` is the one
that matters (every training step of a token model): softmax, log, the target's pick and the
gradient fused into one pass over each block of rows, the rows split across threads
(``parallel.parallel_for``), each row shifted by its target's own logit (no reduction over V to
find the maximum) and the row sums taken by BLAS. float16/bfloat16 logits are computed in float32.
Non-finite logits raise FloatingPointError.

``log_softmax`` does the kernel's operations in the kernel's order (a row maximum, NumPy's row
sums, not BLAS's), so DPO's and beam search's log-probabilities are the kernel's to the bit; it
makes fewer arrays. ``token_logp_backward`` makes no one-hot array (at the target it adds w to
−w p, where the kernel multiplies p − 1 by −w: equal within rounding). ``token_logp``,
``sequence_logp``, ``logistic_loss``, ``kl_divergence``, GRPO's ``importance_ratio`` and
``bernoulli_kl`` are the kernels themselves. ``k3`` takes e^u − 1 as one ``expm1`` where the kernel
subtracts 1 from e^u: near u = 0 the kernel's k3 ≈ u²/2 and 1 − e^u are differences of numbers
near 1.
"""
import numpy as np

from tformer.core import parallel
from tformer.core.dtypes import is_low
# The kernels themselves (a gather, a masked sum, B numbers, a product): nothing to make faster.
from tformer.kernels.losses import (bernoulli_kl, importance_ratio, kl_divergence,  # noqa: F401
                                    logistic_loss, sequence_logp, token_logp)


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


def log_softmax(z):
    """log p = z − m − log Σ_k e^{z_k − m},  m = max_k z_k  (``kernels.losses.log_softmax``).

    The kernel's operations in its order, so the same bits, with one array fewer: z − m is made
    once and the result written over it. Shapes: ``z: (..., V)``  ->  ``log p: (..., V)``, z's dtype.
    """
    x = z - z.max(axis=-1, keepdims=True)                                    # z − m, the result
    x -= np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return x


def token_logp_backward(w, logp, targets, out=None):
    """∂(Σ_t w_t log p_t[y_t])/∂z_t = w_t (onehot(y_t) − p_t)  (the kernel of the same name).

    Written as −w p_t, then + w at the target: no one-hot array of logp's size.
    ``out``: an array of logp's shape to write into (a half of a batch's gradient), else a new one.
    Shapes: ``w: (...)``, ``logp: (..., V)``, ``targets: (...)``  ->  ``(..., V)``.
    """
    w = w[..., None]                                                        # (..., 1)
    d = np.exp(logp, out=out)                                               # p_t = softmax(z_t)
    np.multiply(d, -w, out=d)
    y = targets[..., None]
    np.put_along_axis(d, y, np.take_along_axis(d, y, axis=-1) + w, axis=-1)
    return d


def sequence_logp_backward(g, logp, targets, mask, out=None):
    """∂(Σ_b g_b log π(y_b))/∂z_t = g_b m_t (onehot(y_t) − p_t): ``token_logp_backward`` with
    w_t = g_b m_t. Shapes: ``g: (B,)``, ``logp: (B, T, V)``, ``targets, mask: (B, T)`` -> ``(B, T, V)``.
    """
    return token_logp_backward(g[:, None] * mask, logp, targets, out)


def k3(logp, logp_ref):
    """k3 = e^u − u − 1 and ∂k3/∂log π = 1 − e^u, u = log π_ref − log π (``kernels.losses.k3``),
    with e^u − 1 as one ``np.expm1``. Near u = 0 the derivative −(e^u − 1) is then exact to rounding
    (the kernel's 1 − e^u has a relative error ~ε/abs(u)), and k3 ≈ u²/2 has a relative error ~ε/abs(u)
    (the kernel's e^u − u − 1, ~ε/u²).
    Shapes: ``logp, logp_ref: (...)`` the same  ->  ``(k3: (...), dk3: (...))``.
    """
    u = logp_ref - logp
    em1 = np.expm1(u)                                                       # e^u − 1
    return em1 - u, -em1
