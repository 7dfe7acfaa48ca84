"""Losses, each returning the loss and its gradient with respect to the prediction."""
import numpy as np


def mse_loss(y, target, reduction="mean"):
    """Squared error in the three scalings of the book's systems.

    ``reduction="mean"`` (the post-LN encoder): L = ‖y − t‖² / N, dL/dy = 2(y − t)/N,
    N = y.size (B·T·d).
    ``reduction="half_sum"`` (the two-layer transformer, the single attention layer):
    L = ½‖y − t‖², dL/dy = y − t.
    ``reduction="sum"``: L = ‖y − t‖², dL/dy = 2(y − t).
    Shapes: ``y, target: (...)`` the same  ->  ``(loss: float, dy: like y)``.
    """
    diff = y - target
    sq = float(np.sum(diff * diff))
    if reduction == "mean":
        return sq / diff.size, diff * (2.0 / diff.size)
    if reduction == "half_sum":
        return 0.5 * sq, diff
    return sq, diff * 2.0                                 # "sum"


def log_softmax(z):
    """log p_j = z_j − m − log Σ_k e^{z_k − m},  m = max_k z_k  (softmax and log in one: no log of a tiny p).

    Shapes: ``z: (..., V)`` -> ``log p: (..., V)``.
    """
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def nll(logp, targets, valid):
    """L = (1/N) Σ_n −log p_{n, y_n}, summed over the N positions where ``valid`` is True.

    Shapes: ``logp: (..., V)``, ``targets, valid: (...)``  ->  ``L: float``.
    """
    logp_y = np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]    # log p_{n, y_n}
    N = max(int(valid.sum()), 1)                          # no valid target: L = 0
    return float(-logp_y[valid].sum() / N)


def nll_backward(logp, targets, valid):
    """dL/dz_n = (p_n − onehot(y_n)) / N on valid positions, 0 on the others.

    Shapes: ``logp: (..., V)``, ``targets, valid: (...)``  ->  ``dz: (..., V)``.
    """
    onehot = np.arange(logp.shape[-1]) == targets[..., None]                   # (..., V)
    N = max(int(valid.sum()), 1)
    return (np.exp(logp) - onehot) * valid[..., None] / N


def cross_entropy(logits, targets, ignore_index=None):
    """L = (1/N) Σ_n −log p_{n, y_n},  p_n = softmax(z_n);  dL/dz_n = (p_n − onehot(y_n)) / N.

    N counts the targets that are not ``ignore_index`` (padding): ignored positions add nothing to
    the loss and get a zero gradient; if every target is ignored the loss is 0.0.
    Shapes: ``logits: (..., V)``, ``targets: (...)`` integers in [0, V)
    ->  ``(loss: float, dlogits: like logits)``.
    """
    valid = np.ones(targets.shape, bool) if ignore_index is None else targets != ignore_index
    targets = np.where(valid, targets, 0)                 # any class: these rows are masked out
    logp = log_softmax(logits)
    return nll(logp, targets, valid), nll_backward(logp, targets, valid)
