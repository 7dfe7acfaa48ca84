"""Losses, each returning the loss and its gradient with respect to the prediction, and the pieces
of a sequence's log-probability (DPO, beam search, the decoding and preference measurements);
GRPO's importance ratio and KL estimator k3, and the KL of two yes/no distributions (best-of-n)."""
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
    N = max(int(valid.sum()), 1)
    return softmax_minus_onehot(logp, targets) * valid[..., None] / N


def softmax_minus_onehot(logp, targets):
    """∂(−log p_y)/∂z = p − onehot(y),  p = e^{log p}: the logit gradient of one token's −log p.

    Shapes: ``logp: (..., V)``, ``targets: (...)`` integers in [0, V)  ->  ``(..., V)``.
    """
    onehot = np.arange(logp.shape[-1]) == targets[..., None]                   # (..., V)
    return np.exp(logp) - onehot


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


def token_logp(logp, targets):
    """log p_t[y_t]: each position's log-probability of its target.

    Shapes: ``logp: (..., V)`` (``log_softmax`` of the logits), ``targets: (...)`` integers in
    [0, V)  ->  ``(...)``.
    """
    return np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def sequence_logp(logp, targets, mask):
    """log π(y) = Σ_t m_t log p_t[y_t]: a sequence's log-probability, the sum of its tokens'
    log-probabilities over the positions where the mask is set.

    Shapes: ``logp: (B, T, V)`` (``log_softmax`` of the logits), ``targets: (B, T)`` integers in
    [0, V), ``mask: (B, T)`` bool  ->  ``(B,)``.
    """
    return np.where(mask, token_logp(logp, targets), 0).sum(axis=1)          # (B,)


def token_logp_backward(w, logp, targets):
    """∂(Σ_t w_t log p_t[y_t])/∂z_t = −w_t (p_t − onehot(y_t))  (``softmax_minus_onehot``).

    Shapes: ``w: (...)``, ``logp: (..., V)``, ``targets: (...)``  ->  ``(..., V)``.
    """
    return -w[..., None] * softmax_minus_onehot(logp, targets)


def sequence_logp_backward(g, logp, targets, mask):
    """∂(Σ_b g_b log π(y_b))/∂z_t = −g_b m_t (p_t − onehot(y_t)): ``token_logp_backward`` with
    w_t = g_b m_t. Shapes: ``g: (B,)``, ``logp: (B, T, V)``, ``targets, mask: (B, T)`` -> ``(B, T, V)``.
    """
    return token_logp_backward(g[:, None] * mask, logp, targets)


def logistic_loss(u):
    """L = −log σ(u) = log(1 + e^{−u}) and σ(−u) = −dL/du: returns ``(L, σ(−u))``.

    Both through logaddexp, log(1 + e^{−u}) = logaddexp(0, −u) and σ(−u) = e^{−logaddexp(0, u)}:
    no exponential overflows, whatever the size and sign of u, and σ(−u) is never 1 − σ(u)
    rounded to 0 (DPO's loss of a pair, u = βΔ: the Bradley–Terry likelihood of the preferred
    order).
    Shapes: ``u: (...)``  ->  ``(L: like u, σ(−u): like u)``.
    """
    return np.logaddexp(0, -u), np.exp(-np.logaddexp(0, u))


def kl_divergence(logp, logq):
    """KL(p ‖ q) = Σ_v p_v (log p_v − log q_v) along the last axis, p_v = e^{log p_v}.

    Shapes: ``logp, logq: (..., V)`` log-probabilities (``log_softmax``)  ->  ``(...)``.
    """
    return (np.exp(logp) * (logp - logq)).sum(axis=-1)


def importance_ratio(logp, logp_old, mask=None):
    """ρ = e^{log π − log π_old}: how much more likely the policy makes a sampled token than the
    policy that sampled it (GRPO's and PPO's importance ratio, ``tformer.tuning.grpo``).

    ``mask=None``: one ratio per token, ρ_{i,t} = e^{log π(y_{i,t}) − log π_old(y_{i,t})}.
    With ``mask`` (N, T): one ratio per response (GSPO's sequence level), from the mean log-ratio
    over its tokens, ρ_i = e^{(1/n_i) Σ_t m_{i,t} (log π(y_{i,t}) − log π_old(y_{i,t}))},
    n_i = Σ_t m_{i,t} its length. ∂ρ/∂log π_t = ρ (token), ρ_i m_t / n_i (sequence).
    Shapes: ``logp, logp_old: (N, T)``  ->  ``(N, T)``, or ``(N, 1)`` with ``mask: (N, T)`` bool.
    """
    log_ratio = logp - logp_old
    if mask is not None:
        log_ratio = (np.where(mask, log_ratio, 0).sum(axis=1) / mask.sum(axis=1))[:, None]
    return np.exp(log_ratio)


def k3(logp, logp_ref):
    """Schulman's k3 estimator of KL(π ‖ π_ref) at each sampled token, and its derivative:

        u = log π_ref(y) − log π(y),   k3 = e^u − u − 1 ≥ 0,   ∂k3/∂log π(y) = 1 − e^u.

    Unbiased: for y ~ π, E[e^u] = Σ_y π_ref(y) = 1 and E[−u] = KL(π ‖ π_ref), so E[k3] = KL; never
    negative, since e^u ≥ 1 + u. Written here as derived, e^u − u − 1 (``tformer.fast.losses.k3``
    takes e^u − 1 as one ``expm1``: near u = 0, e^u − u − 1 and 1 − e^u are differences of numbers
    near 1, which lose the digits of k3 ≈ u²/2 and of 1 − e^u ≈ −u).
    Shapes: ``logp, logp_ref: (...)`` the same  ->  ``(k3: (...), dk3: (...))``.
    """
    u = logp_ref - logp
    e = np.exp(u)
    return e - u - 1, 1 - e


def bernoulli_kl(q, p):
    """KL(Bernoulli(q) ‖ Bernoulli(p)) = q log(q/p) + (1 − q) log((1 − q)/(1 − p)), with 0 log 0 = 0.

    The KL of best-of-n against its sampler for a yes/no judge (``tformer.experiments.rl``): the
    line chosen is a draw of π given its verdict, so the two distributions differ only in the
    chance q of a yes against π's p. q > 0 where p = 0 (or q < 1 where p = 1) is +inf.
    Shapes: ``q, p: (...)`` in [0, 1], broadcast together  ->  ``(...)``.
    """
    q, p = np.asarray(q, dtype=np.float64), np.asarray(p, dtype=np.float64)

    def term(a, b):                                       # a log(a/b), 0 where a = 0
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a > 0, a * np.log(np.where(a > 0, a, 1) / b), 0.0)
    return term(q, p) + term(1 - q, 1 - p)
