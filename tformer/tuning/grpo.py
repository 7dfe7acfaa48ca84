"""Group relative policy optimisation (GRPO: Shao et al. 2024, DeepSeekMath): the clipped
policy-gradient loss on groups of sampled responses, and its gradient with respect to every
token's log-probability and logits, by hand.

**The policy gradient.** A policy π_θ samples a response y to a prompt and a judge scores it r(y).
Σ_y ∇π = ∇ Σ_y π = 0 and ∇π = π ∇log π give the score-function identity

    ∇_θ E_{y∼π}[r] = Σ_y r ∇π(y) = E_{y∼π}[r ∇log π(y)],

an average over samples, with no derivative of the judge. E_π[∇log π] = 0, so a baseline b that
does not depend on y may be subtracted: E_π[(r − b) ∇log π] is the same gradient, with less variance.

**The group advantage.** GRPO samples G responses to each of B prompts and takes the group's mean
reward as the baseline, divided by the group's standard deviation (Bessel's, eps = 1e-4, as TRL):

    A_{b,g} = (r_{b,g} − mean_g r_{b,·}) / (std_g r_{b,·} + eps)          scale "group"

Dr. GRPO (Liu et al. 2025) keeps only the difference (scale "none"): dividing by the std weighs up
the prompts whose rewards hardly differ (too easy or too hard), a difficulty bias. TRL's "batch"
divides by one std of the whole batch. The N = B·G responses are rows b·G + g: a group's rows are
consecutive (TRL's order).

**The clipped objective** (PPO's, Schulman et al. 2017). The responses were sampled from π_old, the
policy before this batch's updates; the importance ratio is taken per token or, as GSPO (Zheng et
al. 2025) and TRL's ``importance_sampling_level="sequence"``, once per response from the mean log-ratio:

    ρ_{i,t} = exp(log π(y_{i,t}) − log π_old(y_{i,t}))                       level "token"
    ρ_i = exp((1/|o_i|) Σ_t m_{i,t} (log π(y_{i,t}) − log π_old(y_{i,t})))   level "sequence"
    s = min(ρ A_i, clip(ρ, 1 − ε_low, 1 + ε_high) A_i),

|o_i| = Σ_t m_{i,t} the response's length (m = 1 on its tokens, 0 on padding). The KL penalty to a
frozen reference π_ref uses k3 (Schulman 2020), u = log π_ref(y_{i,t}) − log π(y_{i,t}):

    k3 = e^u − u − 1 ≥ 0,   E_{y∼π}[k3] = E_π[e^u] + KL(π ‖ π_ref) − 1 = KL(π ‖ π_ref)

(E_π[e^u] = Σ_y π_ref(y) = 1, E_π[−u] = KL): unbiased, and never negative (e^u ≥ 1 + u).
Each token's loss is ℓ_{i,t} = −s + β k3_{i,t} (at level "sequence" every token of response i has
the same s_i).

**The normalisations** (TRL 1.16's ``loss_type``): L = Σ_i w_i Σ_t m_{i,t} ℓ_{i,t}, with

    "grpo"     w_i = 1 / (N |o_i|)   each response's mean over its tokens, then the mean over responses
    "bnpo"     w_i = 1 / Σ_j |o_j|   the mean over the batch's tokens
    "dr_grpo"  w_i = 1 / (N T_max)   a constant: T_max = ``max_len``, the longest completion allowed
    "dapo"     w_i = 1 / n           n = ``num_items``, the tokens of the whole generation batch
                                     (its micro-batches together); on one batch, bnpo
    "luspo"    w_i = 1 / N           each response's sum over its tokens, then the mean.

"grpo" divides each response by its own length: a long response with A > 0 is pushed up less per
token than a short one, and a long one with A < 0 pushed down less (Dr. GRPO's length bias).

**The gradient, region by region.** ∂ρ/∂log π_t = ρ at level "token". Where the unclipped term is
the minimum, ∂s/∂log π_t = ρA; where the clip binds, s = (1 ± ε)A is a constant and the gradient 0:

    ρ > 1 + ε_high and A > 0  (already pushed up enough),  ρ < 1 − ε_low and A < 0  (down enough).

Elsewhere (inside the interval, or the clip on the side that does not bind) it is ρA. At level
"sequence" ∂ρ_i/∂log π_t = ρ_i m_t / |o_i| and s_i is counted at |o_i| tokens: the two cancel, and
each token gets ρ_i A_i (or 0) the same. ∂k3/∂log π_t = 1 − e^u. So at both levels

    ∂L/∂log π(y_{i,t}) = w_i m_{i,t} (−[not clipped] ρ A_i + β (1 − e^{u_{i,t}})),

and through log π(y_t) = log softmax(z_t)[y_t] to the logits,

    ∂L/∂z_t = g_t (onehot(y_t) − softmax(z_t)),   g_t = ∂L/∂log π(y_t)   (``token_logp_backward``),

the log-softmax and this backward being the package's (``tformer.fast.losses``), as are ρ
(``importance_ratio``) and k3 with its derivative (``k3``).

**Shapes.** ``logp, logp_old, logp_ref, mask: (N, T)``, N = B·G responses padded to T tokens (the
values off the mask are ignored); ``advantages: (N,)``; ``rewards: (B, G)``; ``logits: (N, T, V)``.
Bad input raises ValueError (TypeError for the wrong kind) naming the argument, what was expected
and what came, once, where it enters. TRL's ``delta`` (two-sided clip), ``use_bias_correction_kl``,
entropy masks and bonus, and its "cispo", "sapo" and "vespo" objectives are not here.

``tests/tuning/test_grpo.py`` checks the gradient by finite differences and PyTorch in float64, the loss
and gradient against TRL's ``GRPOTrainer._compute_loss``, and k3 and the score-function identity
in SymPy.
"""
import numbers
from typing import NamedTuple

import numpy as np

from tformer.core.validate import float_array, same_dtype
from tformer.fast import losses as fast
from tformer.tuning.dpo import check_response

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
LEVELS = ("token", "sequence")
SCALES = ("group", "batch", "none")


class GRPOCache(NamedTuple):
    dlogp: np.ndarray       # ∂L_i/∂log π(y_{i,t}) for a unit upstream gradient (N, T)
    ratio: np.ndarray       # ρ: (N, T) at level "token", (N, 1) at "sequence"
    clipped: np.ndarray     # where the clip binds (zero gradient), ρ's shape, bool
    kl: np.ndarray          # k3 per token (N, T), 0 off the mask; None without logp_ref


class TokenLogpCache(NamedTuple):
    logp: np.ndarray        # log softmax of the logits (N, T, V): the backward's p = e^logp
    targets: np.ndarray     # (N, T), 0 off the mask
    mask: np.ndarray        # (N, T) bool


def group_advantages(rewards, scale="group", eps=1e-4):
    """A_{b,g} = (r_{b,g} − mean_g r_{b,·}) / (std + eps): the group-relative advantage.

    ``scale="group"``: std_g r_{b,·} of each group; ``"batch"``: one std of all B·G rewards;
    ``"none"``: no division (Dr. GRPO). std with Bessel's correction (n − 1), as TRL.
    Shapes: ``rewards: (B, G)``, G ≥ 2  ->  ``(B·G,)``, row b·G + g.
    """
    float_array("rewards", rewards, ndim=2)
    B, G = rewards.shape
    if B == 0 or G < 2:
        raise ValueError(f"rewards: expected B ≥ 1 groups of G ≥ 2 responses, got shape "
                         f"{rewards.shape}")
    bad = np.size(rewards) - np.count_nonzero(np.isfinite(rewards))
    if bad:
        raise ValueError(f"rewards: expected finite values, got {bad} NaN or ±inf")
    if scale not in SCALES:
        raise ValueError(f"scale: expected one of {SCALES}, got {scale!r}")
    _number("eps", eps, low=0, open_low=True)
    A = rewards - rewards.mean(axis=1, keepdims=True)
    if scale != "none":
        A = A / ((rewards.std(axis=1, ddof=1, keepdims=True) if scale == "group"
                  else rewards.std(ddof=1)) + eps)
    return A.reshape(-1).astype(rewards.dtype, copy=False)


def token_logp(logits, targets, mask):
    """log π(y_t) = log softmax(z_t)[y_t] at every response token, 0 off the mask.

    Shapes: ``logits: (N, T, V)``, ``targets: (N, T)`` integers in [0, V) where the mask is set,
    ``mask: (N, T)`` bool (or 0/1) with a response token in every row  ->  ``((N, T), cache)``.
    """
    float_array("logits", logits, ndim=3)
    if logits.shape[0] == 0:
        raise ValueError(f"logits: expected at least one response (N ≥ 1), got shape {logits.shape}")
    targets, mask = check_response("", logits, targets, mask)                # DPO's checks
    logp = fast.log_softmax(logits)
    logp_y = np.where(mask, fast.token_logp(logp, targets), 0).astype(logits.dtype, copy=False)
    return logp_y, TokenLogpCache(logp, targets, mask)


def token_logp_backward(dlogp, cache):
    """∂L/∂z_t = g_t (onehot(y_t) − softmax(z_t)),  g_t = m_t ∂L/∂log π(y_t)
    (``tformer.fast.losses.token_logp_backward``). Shapes: ``dlogp: (N, T)``  ->  ``(N, T, V)``.
    """
    float_array("dlogp", dlogp, ndim=2)
    if dlogp.shape != cache.mask.shape:
        raise ValueError(f"dlogp: expected shape {cache.mask.shape} (the log-probabilities'), "
                         f"got {dlogp.shape}")
    return fast.token_logp_backward(np.where(cache.mask, dlogp, 0), cache.logp, cache.targets)


def grpo_forward(logp, logp_old, logp_ref, mask, advantages, *, loss_type="grpo", level="token",
                 eps_low=0.2, eps_high=None, beta=0.0, max_len=None, num_items=None):
    """L_i = w_i Σ_t m_{i,t} (−min(ρA_i, clip(ρ, 1 − ε_low, 1 + ε_high) A_i) + β k3_{i,t}): each
    response's share of the loss L = Σ_i L_i (the weights w_i of ``loss_type``: see the module).

    ``logp_old=None``: the responses came from this policy (one update per batch): ρ = 1, held
    constant as TRL's ``per_token_logps.detach()``. ``logp_ref`` is needed when β > 0.
    ``eps_high=None``: ε_low. ``max_len``: T_max of "dr_grpo" (default T). ``num_items``: n of "dapo"
    (default this batch's tokens). TRL's defaults are ε = 0.2, β = 0 (and ``loss_type="dapo"``).
    Shapes: ``logp, logp_old, logp_ref, mask: (N, T)``, ``advantages: (N,)``  ->  ``((N,), cache)``.
    """
    logp, logp_old, logp_ref, mask = _check_grpo(logp, logp_old, logp_ref, mask, advantages, loss_type,
                                                 level, eps_low, eps_high, beta, max_len, num_items)
    eps_high = eps_low if eps_high is None else eps_high
    N, T = logp.shape
    n = mask.sum(axis=1)                                                     # |o_i|
    rho = fast.importance_ratio(logp, logp_old, mask if level == "sequence" else None)  # (N, T|1)
    A = advantages[:, None]
    clipped = ((A > 0) & (rho > 1 + eps_high)) | ((A < 0) & (rho < 1 - eps_low))
    ell = -np.minimum(rho * A, np.clip(rho, 1 - eps_low, 1 + eps_high) * A)  # −s
    d = -np.where(clipped, 0, rho * A)                                       # ∂(−s)/∂log π_t
    kl = None
    if logp_ref is not None:
        k3, dk3 = fast.k3(logp, logp_ref)                                    # e^u − u − 1, 1 − e^u
        kl = np.where(mask, k3, 0)
        if beta > 0:
            ell, d = ell + beta * kl, d + beta * dk3
    den = {"grpo": N * n, "bnpo": n.sum(), "dr_grpo": N * (T if max_len is None else max_len),
           "dapo": n.sum() if num_items is None else num_items, "luspo": N}[loss_type]
    w = np.broadcast_to(1 / np.asarray(den, np.float64), (N,)).astype(logp.dtype)   # w_i
    losses = w * np.where(mask, ell, 0).sum(axis=1)                          # ℓ (N, 1) broadcasts
    dlogp = w[:, None] * np.where(mask, d, 0)
    return losses, GRPOCache(dlogp, rho, clipped, kl)


def grpo_backward(dlosses, cache):
    """∂L/∂log π(y_{i,t}) = g_i w_i m_{i,t} (−[not clipped] ρ A_i + β (1 − e^{u_{i,t}})).

    Shapes: ``dlosses: (N,)`` (g, the upstream gradient of each response's share)  ->  ``(N, T)``.
    """
    N = cache.dlogp.shape[0]
    float_array("dlosses", dlosses, ndim=1)
    if dlosses.shape != (N,):
        raise ValueError(f"dlosses: expected shape ({N},) (one per response), got {dlosses.shape}")
    return dlosses[:, None] * cache.dlogp


def grpo_loss(logp, logp_old, logp_ref, mask, advantages, **options):
    """L = Σ_i L_i (``grpo_forward``) and ∂L/∂log π: ``(L, dlogp: (N, T))``.

    Arguments and options as ``grpo_forward``."""
    losses, cache = grpo_forward(logp, logp_old, logp_ref, mask, advantages, **options)
    return float(losses.sum()), cache.dlogp.copy()


# --- the checks, once, where the arguments enter ---------------------------------------------------

def _number(name, x, low, open_low=False, high=None, integer=False):
    """A real (an integer if ``integer``) in [low, high) ((low, high) if ``open_low``), finite."""
    kind = "an integer" if integer else "a finite number"
    bounds = f"{'>' if open_low else '≥'} {low}" + ("" if high is None else f" and < {high}")
    ok_type = numbers.Integral if integer else numbers.Real
    if not isinstance(x, ok_type) or isinstance(x, bool):
        raise TypeError(f"{name}: expected {kind} {bounds}, got {type(x).__name__}")
    if not (np.isfinite(x) and (x > low if open_low else x >= low) and (high is None or x < high)):
        raise ValueError(f"{name}: expected {kind} {bounds}, got {x}")


def _check_grpo(logp, logp_old, logp_ref, mask, advantages, loss_type, level, eps_low, eps_high, beta,
                max_len, num_items):
    """Checks every argument; returns logp, logp_old, logp_ref with 0 off the mask, and the mask as bool."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type: expected one of {LOSS_TYPES}, got {loss_type!r}")
    if level not in LEVELS:
        raise ValueError(f"level: expected one of {LEVELS}, got {level!r}")
    _number("eps_low", eps_low, 0, high=1)
    if eps_high is not None:
        _number("eps_high", eps_high, 0)
    _number("beta", beta, 0)
    float_array("logp", logp, ndim=2)
    N, T = logp.shape
    if N == 0 or T == 0:
        raise ValueError(f"logp: expected at least one response (N ≥ 1) of one token (T ≥ 1), "
                         f"got shape {logp.shape}")
    if max_len is not None:
        _number("max_len", max_len, T, integer=True)
    if num_items is not None:
        _number("num_items", num_items, 0, open_low=True)
    if not isinstance(mask, np.ndarray) or mask.shape != (N, T):
        got = mask.shape if isinstance(mask, np.ndarray) else type(mask).__name__
        raise ValueError(f"mask: expected shape {(N, T)} (from logp), got {got}")
    if mask.dtype != bool and not np.issubdtype(mask.dtype, np.integer):
        raise TypeError(f"mask: expected a bool (or 0/1 integer) array, got dtype {mask.dtype}")
    if mask.dtype != bool and not np.isin(mask, (0, 1)).all():
        raise ValueError(f"mask: expected values 0 or 1, got {np.unique(mask).tolist()}")
    mask = mask.astype(bool)
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise ValueError(f"mask: expected at least one response token (True) in every row, got none in "
                         f"row(s) {empty.tolist()}")
    if beta > 0 and logp_ref is None:
        raise ValueError(f"logp_ref: expected the reference's log-probabilities (N, T) when beta > 0 "
                         f"(beta = {beta}), got None")
    out = []
    for name, x in (("logp", logp), ("logp_old", logp_old), ("logp_ref", logp_ref)):
        if x is None:
            out.append(None)
            continue
        float_array(name, x, ndim=2)
        if x.shape != (N, T):
            raise ValueError(f"{name}: expected shape {(N, T)} (from logp), got {x.shape}")
        on = x[mask]
        if not np.isfinite(on).all() or (on > 0).any():
            raise ValueError(f"{name}: expected finite log-probabilities ≤ 0 on the mask, got min "
                             f"{on.min()} and max {on.max()}")
        out.append(np.where(mask, x, 0).astype(x.dtype, copy=False))
    float_array("advantages", advantages, ndim=1)
    if advantages.shape != (N,):
        raise ValueError(f"advantages: expected shape ({N},) (one per response), got {advantages.shape}")
    if not np.isfinite(advantages).all():
        raise ValueError(f"advantages: expected finite values, got "
                         f"{np.size(advantages) - np.count_nonzero(np.isfinite(advantages))} NaN or ±inf")
    same_dtype(logp=logp, logp_old=logp_old, logp_ref=logp_ref, advantages=advantages)
    logp, logp_old, logp_ref = out
    return logp, (logp if logp_old is None else logp_old), logp_ref, mask
