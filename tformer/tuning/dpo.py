"""Direct preference optimisation (Rafailov et al. 2023): the loss on preference pairs, derived,
and its gradient with respect to the policy's logits, by hand.

**The problem DPO solves.** For a prompt x, a reward r(x, y) and a reference policy π_ref (the
model before preference tuning), the KL-constrained reward maximisation over the policy's
distribution π of responses y given x,

    max_π  E_{y∼π}[r(x, y)] − β KL(π ‖ π_ref),        β > 0,

has a closed-form maximiser. Let Z(x) = Σ_y π_ref(y|x) e^{r(x, y)/β} and
π*(y|x) = π_ref(y|x) e^{r(x, y)/β} / Z(x), so that r = β log(π*/π_ref) + β log Z. Put that into
the objective and collect the logarithms: for every π on the simplex

    E_π[r] − β KL(π ‖ π_ref) = β log Z(x) − β KL(π ‖ π*).

KL ≥ 0, zero only at π = π*: π* is the one maximiser, and the reward is written with it as

    r(x, y) = β log(π*(y|x) / π_ref(y|x)) + β log Z(x).                              (1)

**Preferences.** The Bradley–Terry model prefers a response y_w to y_l with probability
σ(r(x, y_w) − r(x, y_l)). With (1) both rewards carry the same β log Z(x), which cancels:

    p(y_w ≻ y_l | x) = σ(β log π*(y_w|x)/π_ref(y_w|x) − β log π*(y_l|x)/π_ref(y_l|x)):

no reward model and no partition function, only the policy and the reference. Maximum likelihood
of the policy π on N pairs (y_w preferred to y_l) is the DPO loss

    L = (1/N) Σ_i −log σ(β Δ_i),
    Δ = (log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x)),

where a response's log-probability sums over its positions, log π(y|x) = Σ_t m_t log softmax(z_t)[y_t]
(m_t = 1 on the response's positions; the prompt and the padding have m_t = 0).

**The gradient.** d(−log σ(u))/du = −σ(−u), and ∂ log softmax(z_t)[y_t] / ∂z_t = onehot(y_t) −
softmax(z_t). So, for a pair with upstream gradient g (g = 1/N for the mean),

    ∂L/∂z^w_t =  g β σ(−βΔ) m^w_t (softmax(z^w_t) − onehot(y^w_t)),
    ∂L/∂z^l_t = −g β σ(−βΔ) m^l_t (softmax(z^l_t) − onehot(y^l_t)).

The chosen response is pushed as cross-entropy pushes a target, the rejected one the other way,
both weighted by σ(−βΔ): the probability the implicit reward β log(π/π_ref) gives the wrong
order. A pair already ordered by a wide margin adds almost nothing. The reference is a constant:
its log-probabilities come once from the frozen model (``sequence_logp``).

**Numerics.** −log σ(u) = log(1 + e^{−u}) = logaddexp(0, −u) and σ(−u) = exp(−logaddexp(0, u)):
no overflow, and no 1 − σ rounded to 0, however large u is (``logistic_loss``); the log-softmax
subtracts the row maximum. Every one of these equations has its home in ``tformer.kernels.losses``
(the reference) and ``tformer.fast.losses`` (what runs here): ``log_softmax``, ``sequence_logp``,
``sequence_logp_backward``, ``logistic_loss``.

**Shapes.** ``logits_w: (B, T_w, V)`` and ``logits_l: (B, T_l, V)`` (a pair's two responses may
differ in length), ``targets_*, mask_*: (B, T_*)``, ``ref_logp_w, ref_logp_l: (B,)``; B pairs.
The logits at position t score the target at t: for a causal model, logits[:, :-1] against
tokens[:, 1:], as for ``cross_entropy``. Bad input raises ValueError (TypeError for the wrong
kind) naming the argument, what was expected and what came, once, where it enters.

``tests/tuning/test_dpo.py`` derives the maximiser and the gradient in SymPy, checks the backward by
finite differences and against PyTorch in float64, and the loss against Hugging Face TRL's.
"""
import numbers
from typing import NamedTuple

import numpy as np

from tformer.core.validate import float_array, int_array, same_dtype
from tformer.fast import losses as fast


class DPOCache(NamedTuple):
    logp_w: np.ndarray      # log softmax of the chosen logits (B, T_w, V): the backward's p = e^logp
    targets_w: np.ndarray   # (B, T_w), 0 where the mask is off
    mask_w: np.ndarray      # (B, T_w) bool
    logp_l: np.ndarray      # the same for the rejected response (B, T_l, V)
    targets_l: np.ndarray
    mask_l: np.ndarray
    beta: float
    sig: np.ndarray         # σ(−βΔ) per pair (B,)


def sequence_logp(logits, targets, mask):
    """log π(y|x) = Σ_t m_t log softmax(z_t)[y_t]: each response's log-probability (checked).

    The reference model's log-probabilities, computed once from its logits, are this.
    Shapes: ``logits: (B, T, V)``, ``targets: (B, T)`` integers in [0, V) where the mask is set,
    ``mask: (B, T)`` bool (or 0/1) with a response position in every row  ->  ``(B,)``.
    """
    targets, mask = check_response("", logits, targets, mask)
    return fast.sequence_logp(fast.log_softmax(logits), targets, mask)


def dpo_forward(logits_w, targets_w, mask_w, logits_l, targets_l, mask_l, ref_logp_w, ref_logp_l,
                beta):
    """L_i = −log σ(β Δ_i),  Δ_i = (log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l)).

    The loss of each pair; ``log π(y) = Σ_t m_t log softmax(z_t)[y_t]`` (``sequence_logp``).
    Shapes: ``logits_w: (B, T_w, V)``, ``targets_w, mask_w: (B, T_w)``, ``logits_l: (B, T_l, V)``,
    ``targets_l, mask_l: (B, T_l)``, ``ref_logp_w, ref_logp_l: (B,)``, ``beta > 0``
    ->  ``(losses: (B,), cache)``.
    """
    targets_w, mask_w, targets_l, mask_l = _check_dpo(
        logits_w, targets_w, mask_w, logits_l, targets_l, mask_l, ref_logp_w, ref_logp_l, beta)
    logp_w, logp_l = fast.log_softmax(logits_w), fast.log_softmax(logits_l)  # (B, T_*, V)
    delta = ((fast.sequence_logp(logp_w, targets_w, mask_w) - ref_logp_w)
             - (fast.sequence_logp(logp_l, targets_l, mask_l) - ref_logp_l))   # (B,)
    losses, sig = fast.logistic_loss(beta * delta)                           # −log σ(βΔ), σ(−βΔ)
    return losses, DPOCache(logp_w, targets_w, mask_w, logp_l, targets_l, mask_l, beta, sig)


def dpo_backward(dlosses, cache, out=None):
    """∂L/∂z^w_t = g β σ(−βΔ) m^w_t (softmax(z^w_t) − onehot(y^w_t)); ∂L/∂z^l_t: the same, negated.

    In the forward L = −log σ(βΔ), so ∂L/∂Δ = −β σ(−βΔ); Δ holds +log π(y_w) and −log π(y_l),
    and ∂ log π(y)/∂z_t = m_t (onehot(y_t) − softmax(z_t)).
    Shapes: ``dlosses: (B,)`` (g, the upstream gradient of each pair's loss)
    ->  ``(dlogits_w: (B, T_w, V), dlogits_l: (B, T_l, V))``. ``out``: two arrays of those shapes
    and the logits' dtype to write them into (the two halves of one batch's gradient), else new ones.
    """
    B = cache.sig.shape[0]
    float_array("dlosses", dlosses, ndim=1)
    if dlosses.shape != (B,):
        raise ValueError(f"dlosses: expected shape ({B},) (one per pair), got {dlosses.shape}")
    out_w, out_l = (None, None) if out is None else out
    dlogp_w = -dlosses * cache.beta * cache.sig                              # ∂L/∂log π(y_w) = ∂L/∂Δ
    return (fast.sequence_logp_backward(dlogp_w, cache.logp_w, cache.targets_w, cache.mask_w, out_w),
            fast.sequence_logp_backward(-dlogp_w, cache.logp_l, cache.targets_l, cache.mask_l, out_l))


def dpo_loss(logits_w, targets_w, mask_w, logits_l, targets_l, mask_l, ref_logp_w, ref_logp_l,
             beta):
    """L = (1/B) Σ_i −log σ(β Δ_i) and its gradient: ``(L, (dlogits_w, dlogits_l))``.

    The mean of ``dpo_forward`` over the B pairs; the gradient is ``dpo_backward`` with g = 1/B.
    Shapes as ``dpo_forward``  ->  ``(L: float, (dlogits_w: (B, T_w, V), dlogits_l: (B, T_l, V)))``.
    """
    losses, cache = dpo_forward(logits_w, targets_w, mask_w, logits_l, targets_l, mask_l,
                                ref_logp_w, ref_logp_l, beta)
    B = losses.shape[0]
    return float(losses.mean()), dpo_backward(np.full(B, 1.0 / B, dtype=losses.dtype), cache)


# --- the checks, once, where the arguments enter ---------------------------------------------------

def check_response(suffix, logits, targets, mask):
    """``logits: (B, T, V)`` finite, ``targets, mask: (B, T)``, a response position in every row,
    targets in [0, V) on them. Returns the targets (0 off the mask) and the mask as bool."""
    float_array(f"logits{suffix}", logits, ndim=3)
    int_array(f"targets{suffix}", targets, ndim=2)
    B, T, V = logits.shape
    if B == 0:
        raise ValueError(f"logits{suffix}: expected at least one pair (B ≥ 1), got shape {logits.shape}")
    for name, x in ((f"targets{suffix}", targets), (f"mask{suffix}", mask)):
        if not isinstance(x, np.ndarray) or x.shape != (B, T):
            got = x.shape if isinstance(x, np.ndarray) else type(x).__name__
            raise ValueError(f"{name}: expected shape {(B, T)} (from logits{suffix} "
                             f"{logits.shape}), got {got}")
    if mask.dtype != bool and not np.issubdtype(mask.dtype, np.integer):
        raise TypeError(f"mask{suffix}: expected a bool (or 0/1 integer) array, got dtype {mask.dtype}")
    if mask.dtype != bool and not np.isin(mask, (0, 1)).all():
        raise ValueError(f"mask{suffix}: expected values 0 or 1, got {np.unique(mask).tolist()}")
    mask = mask.astype(bool)
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise ValueError(f"mask{suffix}: expected at least one response position (True) in every "
                         f"row, got none in row(s) {empty.tolist()}")
    on = targets[mask]
    if on.min() < 0 or on.max() >= V:
        raise ValueError(f"targets{suffix}: expected values in [0, {V}) on the response positions, "
                         f"got min {on.min()} and max {on.max()}")
    bad = np.size(logits) - np.count_nonzero(np.isfinite(logits))
    if bad:
        raise ValueError(f"logits{suffix}: expected finite values, got {bad} NaN or ±inf")
    return np.where(mask, targets, 0), mask


def _check_dpo(logits_w, targets_w, mask_w, logits_l, targets_l, mask_l, ref_logp_w, ref_logp_l, beta):
    if not isinstance(beta, numbers.Real) or isinstance(beta, bool):
        raise TypeError(f"beta: expected a finite number > 0, got {type(beta).__name__}")
    if not (np.isfinite(beta) and beta > 0):
        raise ValueError(f"beta: expected a finite number > 0, got {beta}")
    targets_w, mask_w = check_response("_w", logits_w, targets_w, mask_w)
    B, _, V = logits_w.shape
    float_array("logits_l", logits_l, ndim=3)
    if logits_l.shape[0] != B or logits_l.shape[2] != V:
        raise ValueError(f"logits_l: expected B = {B} pairs and V = {V} (from logits_w "
                         f"{logits_w.shape}), got shape {logits_l.shape}")
    targets_l, mask_l = check_response("_l", logits_l, targets_l, mask_l)
    for name, ref in (("ref_logp_w", ref_logp_w), ("ref_logp_l", ref_logp_l)):
        float_array(name, ref)
        if ref.shape != (B,):
            raise ValueError(f"{name}: expected shape ({B},) (one per pair), got {ref.shape}")
        if not np.isfinite(ref).all() or (ref > 0).any():
            raise ValueError(f"{name}: expected finite log-probabilities ≤ 0, got min {ref.min()} "
                             f"and max {ref.max()}")
    same_dtype(logits_w=logits_w, logits_l=logits_l, ref_logp_w=ref_logp_w, ref_logp_l=ref_logp_l)
    return targets_w, mask_w, targets_l, mask_l
