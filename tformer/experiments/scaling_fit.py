"""The parametric scaling law L(N, D) = E + A/N^α + B/D^β, fitted as Hoffmann et al. (2022) fit it.

    L̂(N, D) = E + A·N^−α + B·D^−β                       N weights, D training tokens, L nats/char
    θ = (a, b, e, α, β),   A = eᵃ, B = eᵇ, E = eᵉ
    min_θ  Σ_i Huber_δ( LSE(a − α·ln N_i,  b − β·ln D_i,  e) − ln L_i ),   δ = 10⁻³
    C = 6·N·D  →  N_opt(C) = G·(C/6)^(β/(α+β)),   D_opt(C) = G⁻¹·(C/6)^(α/(α+β)),
                  G = (αA / (βB))^(1/(α+β))

Chinchilla's "approach 3": the residual is taken between logarithms (LSE, log-sum-exp, is the log
of the three terms' sum), the Huber loss keeps a few bad runs from steering the fit, and L-BFGS
starts from a grid of initialisations, the best end point kept. No SciPy here: ``lbfgs`` is a
plain two-loop L-BFGS with a backtracking (Armijo) line search on the analytic gradient
(``objective``), and the grid is scored all at once (``objective_batch``) so that only its best
few points are optimised.

``isoflop_minimum`` is their "approach 2" for one budget: a parabola in ln N through the losses of
one IsoFLOP profile, its vertex the budget's best size.

Shapes: ``N, D, L`` are ``(n,)`` arrays (one entry per run); ``θ`` is ``(5,)``; a batch of
parameter sets ``(k, 5)``. ``bootstrap`` refits on runs resampled with replacement and gives the
spread of θ and of anything computed from it (intervals by percentiles).
"""
import itertools

import numpy as np

DELTA = 1e-3
NAMES = ("a", "b", "e", "alpha", "beta")
# Hoffmann et al. (2022), approach 3 (their eq. 10 and appendix D.2): loss in nats per token of
# their tokenizer, N all parameters, D tokens.
CHINCHILLA = dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
# Their grid of initialisations (appendix D.2).
GRID = dict(alpha=(0.0, 0.5, 1.0, 1.5, 2.0), beta=(0.0, 0.5, 1.0, 1.5, 2.0),
            e=(-1.0, -0.5, 0.0, 0.5, 1.0), a=(0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
            b=(0.0, 5.0, 10.0, 15.0, 20.0, 25.0))


def huber(r, delta=DELTA):
    """Huber_δ(r) = r²/2 for |r| ≤ δ, δ(|r| − δ/2) beyond; and its derivative."""
    small = np.abs(r) <= delta
    value = np.where(small, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta))
    slope = np.where(small, r, delta * np.sign(r))
    return value, slope


def _terms(theta, logN, logD):
    """The three log-terms (a − α ln N, b − β ln D, e), shape ``(..., n, 3)``."""
    a, b, e, alpha, beta = (theta[..., i, None] for i in range(5))
    return np.stack([a - alpha * logN, b - beta * logD, np.broadcast_to(e, (a - alpha * logN).shape)],
                    axis=-1)


def _lse(u):
    m = u.max(axis=-1, keepdims=True)
    w = np.exp(u - m)
    s = w.sum(axis=-1, keepdims=True)
    return (m + np.log(s))[..., 0], w / s                              # (..., n), (..., n, 3)


def objective(theta, logN, logD, logL, delta=DELTA):
    """Σ_i Huber_δ(LSE_i − ln L_i) and its gradient with respect to θ, ``(5,)``."""
    lse, w = _lse(_terms(theta, logN, logD))                          # (n,), (n, 3)
    value, slope = huber(lse - logL, delta)
    grad = np.array([slope @ w[:, 0], slope @ w[:, 1], slope @ w[:, 2],
                     -slope @ (w[:, 0] * logN), -slope @ (w[:, 1] * logD)])
    return float(value.sum()), grad


def objective_batch(thetas, logN, logD, logL, delta=DELTA):
    """``objective``'s value for each of ``thetas: (k, 5)`` at once, ``(k,)``."""
    lse, _ = _lse(_terms(thetas, logN, logD))                         # (k, n)
    return huber(lse - logL, delta)[0].sum(axis=-1)


def lbfgs(fun, x0, max_iter=500, memory=10, tol=1e-12):
    """Minimise ``fun(x) -> (value, gradient)`` from ``x0``: two-loop L-BFGS, Armijo backtracking.

    Stops when the gradient's largest entry or the step falls below ``tol``; returns ``(x, value)``.
    """
    x = np.asarray(x0, dtype=np.float64).copy()
    f, g = fun(x)
    S, Y = [], []
    for _ in range(max_iter):
        q = g.copy()
        alphas = []
        for s, y in zip(reversed(S), reversed(Y)):                    # first loop, newest first
            a = (s @ q) / (y @ s)
            alphas.append(a)
            q -= a * y
        q *= (S[-1] @ Y[-1]) / (Y[-1] @ Y[-1]) if S else 1.0 / max(1.0, np.abs(g).max())
        for (s, y), a in zip(zip(S, Y), reversed(alphas)):             # second loop, oldest first
            q += s * (a - (y @ q) / (y @ s))
        p = -q
        if g @ p >= 0:                                                 # not a descent: restart
            S, Y, p = [], [], -g / max(1.0, np.abs(g).max())
        t = 1.0
        while True:
            x_new = x + t * p
            f_new, g_new = fun(x_new)
            if np.isfinite(f_new) and f_new <= f + 1e-4 * t * (g @ p):
                break
            t *= 0.5
            if t < 1e-20:
                return x, f
        s, y = x_new - x, g_new - g
        if y @ s > 1e-18:
            S.append(s)
            Y.append(y)
            S, Y = S[-memory:], Y[-memory:]
        x, f, g = x_new, f_new, g_new
        if np.abs(g).max() < tol or np.abs(s).max() < tol:
            break
    return x, f


def grid(spec=GRID):
    """The initialisations as ``(k, 5)`` rows (a, b, e, α, β): every combination of ``spec``."""
    return np.array(list(itertools.product(spec["a"], spec["b"], spec["e"], spec["alpha"],
                                           spec["beta"])), dtype=np.float64)


def fit(N, D, L, starts=16, inits=None, delta=DELTA):
    """θ minimising the Huber objective: the grid scored, L-BFGS from its ``starts`` best points
    (and from ``inits``, extra rows), the lowest end point returned. ``(θ (5,), value)``."""
    logN, logD, logL = (np.log(np.asarray(v, dtype=np.float64)) for v in (N, D, L))
    if not (logN.shape == logD.shape == logL.shape and logN.ndim == 1 and logN.size >= 5):
        raise ValueError(f"N, D, L: expected three (n,) arrays with n ≥ 5 (five constants), got "
                         f"shapes {np.shape(N)}, {np.shape(D)}, {np.shape(L)}")
    g = grid()
    scores = objective_batch(g, logN, logD, logL, delta)
    points = g[np.argsort(scores)[:starts]]
    if inits is not None:
        points = np.vstack([np.atleast_2d(inits), points])
    best = (None, np.inf)
    for x0 in points:
        x, f = lbfgs(lambda t: objective(t, logN, logD, logL, delta), x0)
        if f < best[1]:
            best = (x, f)
    return best


def constants(theta):
    """θ -> ``{"E", "A", "B", "alpha", "beta"}`` (the law's constants)."""
    a, b, e, alpha, beta = np.asarray(theta, dtype=np.float64)
    return dict(E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)), alpha=float(alpha),
                beta=float(beta))


def predict(theta, N, D):
    """L̂(N, D) = E + A·N^−α + B·D^−β (broadcasts over N and D)."""
    c = constants(theta)
    return c["E"] + c["A"] * np.asarray(N, float) ** -c["alpha"] + c["B"] * np.asarray(D, float) ** -c["beta"]


def compute_optimal(theta, C):
    """``(N_opt, D_opt)`` minimising L̂ under C = 6·N·D (the closed form above)."""
    c = constants(theta)
    al, be = c["alpha"], c["beta"]
    G = (al * c["A"] / (be * c["B"])) ** (1.0 / (al + be))
    C6 = np.asarray(C, dtype=np.float64) / 6.0
    return G * C6 ** (be / (al + be)), C6 ** (al / (al + be)) / G


def bootstrap(N, D, L, n_boot=200, seed=0, starts=4):
    """θ refitted on ``n_boot`` resamples of the runs (with replacement), ``(n_boot, 5)``; each
    refit starts from the full fit's θ and the grid's ``starts`` best points for that resample."""
    N, D, L = (np.asarray(v, dtype=np.float64) for v in (N, D, L))
    theta, _ = fit(N, D, L)
    rng = np.random.default_rng(seed)
    out = np.empty((n_boot, 5))
    for k in range(n_boot):
        i = rng.integers(0, N.size, N.size)
        out[k] = fit(N[i], D[i], L[i], starts=starts, inits=theta)[0]
    return out


def interval(samples, level=0.95):
    """The central ``level`` percentile interval of ``samples`` along axis 0: ``(low, high)``."""
    q = 50.0 * (1.0 - level)
    return np.percentile(samples, q, axis=0), np.percentile(samples, 100.0 - q, axis=0)


def predict_samples(thetas, N, D):
    """L̂(N, D) under each of ``thetas: (k, 5)`` (a bootstrap), ``(k,)`` for scalar N and D."""
    return np.array([predict(t, N, D) for t in np.atleast_2d(thetas)])


def arrays(runs):
    """``(N, D, L)`` of a sweep's runs (``scaling_sweep``'s records): weights, tokens, nats/char."""
    return tuple(np.array([r[k] for r in runs], dtype=np.float64)
                 for k in ("n_weights", "tokens", "val_nats_per_char"))


def isoflop_minimum(N, L):
    """L ≈ c₀ + c₁·x + c₂·x², x = ln N, fitted to one profile; ``(N*, L*)`` at its vertex
    (x* = −c₁ / 2c₂). A profile with no minimum inside (c₂ ≤ 0) is a ValueError."""
    x, L = np.log(np.asarray(N, dtype=np.float64)), np.asarray(L, dtype=np.float64)
    if x.size < 3:
        raise ValueError(f"N, L: expected at least 3 sizes of one profile, got {x.size}")
    c2, c1, c0 = np.polyfit(x, L, 2)
    if c2 <= 0:
        raise ValueError(f"N, L: the profile curves down (c2 = {c2:.3g}): no minimum to find")
    x_star = -c1 / (2 * c2)
    return float(np.exp(x_star)), float(c0 + c1 * x_star + c2 * x_star ** 2)
