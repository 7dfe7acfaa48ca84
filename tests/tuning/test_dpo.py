"""The DPO loss (tformer.tuning.dpo), checked the book's three ways and against Hugging Face TRL.

(a) SymPy: on three responses the maximiser of E_π[r] − β KL(π ‖ π_ref) over the simplex is
    π_ref e^{r/β} / Z (Lagrange stationarity, solved; a maximum: J is strictly concave, and
    J(π) = β log Z − β KL(π ‖ π*) on the simplex); the reward written with π* and the
    Bradley–Terry probability, in which β log Z cancels. (b) SymPy: the gradient of the loss with
    respect to both sequences' logits (T = 2, V = 3, symbolic masks and β) is the closed form
    ±β σ(−βΔ) m_t (softmax − onehot) that ``dpo_backward`` implements, and equals it in numbers.
    (c) Finite differences in float64 with a random upstream gradient per pair, masks with prompt
    and padding. (d) PyTorch float64 autograd. (e) TRL's DPOTrainer loss (``loss_type="sigmoid"``)
    on the same log-probabilities. (f) Large margins: the loss and σ(−βΔ) to float64's relative
    precision (mpmath), no overflow in float32. (g) Bad input.
    (d) and (e) are parity tests: a skip fails the run (tests/conftest.py).
"""
import mpmath
import numpy as np
import pytest
import sympy as sp

from tformer.tuning.dpo import dpo_backward, dpo_forward, dpo_loss, sequence_logp
from tformer.core.gradcheck import check_kernel, rel_error


def pairs(seed=0, B=3, T_w=6, T_l=5, V=7, dtype=np.float64, beta=0.7):
    """Random logits for both responses, a prompt of 1–2 positions and trailing padding (masked,
    with the pad target −100), and reference log-probabilities from other random logits."""
    rng = np.random.default_rng(seed)
    args = []
    for T in (T_w, T_l):
        z = (2 * rng.standard_normal((B, T, V))).astype(dtype)
        y = rng.integers(0, V, (B, T))
        pos = np.arange(T)
        start = rng.integers(1, 3, B)[:, None]                        # the prompt
        end = np.maximum(T - rng.integers(0, 3, B)[:, None], start + 1)  # the padding
        m = (pos >= start) & (pos < end)
        y = np.where(m, y, -100)
        args.append((z, y, m))
    (zw, yw, mw), (zl, yl, ml) = args
    ref_w = sequence_logp(rng.standard_normal(zw.shape).astype(dtype), yw, mw)
    ref_l = sequence_logp(rng.standard_normal(zl.shape).astype(dtype), yl, ml)
    return [zw, yw, mw, zl, yl, ml, ref_w, ref_l], beta


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# --- (a) the derivation: the KL-constrained optimum and the Bradley-Terry model -------------------

def test_sympy_the_kl_constrained_maximiser_is_the_reference_tilted_by_the_reward():
    n = 3
    beta = sp.Symbol("beta", positive=True)
    lam = sp.Symbol("lambda", real=True)
    pi = sp.symbols("pi1:4", positive=True)
    q = sp.symbols("q1:4", positive=True)                            # π_ref
    r = sp.symbols("r1:4", real=True)
    J = sum(pi[i] * r[i] for i in range(n)) - beta * sum(pi[i] * sp.log(pi[i] / q[i]) for i in range(n))
    Lag = J + lam * (sum(pi) - 1)
    # stationarity: ∂Λ/∂π_i = r_i − β(log(π_i/q_i) + 1) + λ = 0, solved for π_i (one solve, any i)
    p_, q_, r_ = sp.symbols("p q r", positive=True)
    dL = sp.diff(Lag.subs({pi[0]: p_, q[0]: q_, r[0]: r_}), p_)
    (p_of,) = sp.solve(dL, p_)
    p_lam = [p_of.subs({q_: q[i], r_: r[i]}) for i in range(n)]
    # the multiplier from Σ π_i = 1
    (lam_star,) = sp.solve(sum(p_lam) - 1, lam)
    Z = sum(q[i] * sp.exp(r[i] / beta) for i in range(n))
    pstar = [q[i] * sp.exp(r[i] / beta) / Z for i in range(n)]
    assert sp.simplify(lam_star - beta * (1 - sp.log(Z))) == 0
    for i in range(n):
        assert sp.simplify(p_lam[i].subs(lam, lam_star) / pstar[i]) == 1
        assert sp.simplify(sp.diff(Lag, pi[i]).subs(dict(zip(pi, pstar))).subs(lam, lam_star)) == 0
    assert sp.simplify(sum(pstar)) == 1
    # a maximum: the Hessian of J is diag(−β/π_i), negative definite, J strictly concave; and on
    # the simplex J(π) = β log Z − β KL(π ‖ π*), with KL ≥ 0, zero only at π*
    H = sp.hessian(J, pi)
    assert H == sp.diag(*[-beta / pi[i] for i in range(n)])
    assert all(H[i, i].is_negative for i in range(n))
    KL = sum(pi[i] * sp.log(pi[i] / pstar[i]) for i in range(n))
    on_simplex = (J - (beta * sp.log(Z) - beta * KL)).subs(pi[2], 1 - pi[0] - pi[1])
    assert sp.expand(sp.expand_log(on_simplex, force=True)) == 0
    # (1): r = β log(π*/π_ref) + β log Z, and in the Bradley-Terry difference β log Z cancels
    reward = [beta * sp.log(pstar[i] / q[i]) + beta * sp.log(Z) for i in range(n)]
    assert all(sp.expand(sp.expand_log(reward[i] - r[i], force=True)) == 0 for i in range(n))
    implicit = [beta * sp.log(pstar[i] / q[i]) for i in range(n)]    # the rewards without β log Z
    assert sp.expand(sp.expand_log((reward[0] - reward[1]) - (implicit[0] - implicit[1]),
                                   force=True)) == 0
    assert sp.expand(sp.expand_log(implicit[0] - implicit[1], force=True)) == r[0] - r[1]


# --- (b) the gradient, derived symbolically --------------------------------------------------------

T, V, Y_W, Y_L = 2, 3, (0, 2), (1, 1)


def _symbolic_dpo():
    beta = sp.Symbol("beta", positive=True)
    zw = sp.Matrix(T, V, lambda t, v: sp.Symbol(f"zw_{t}{v}", real=True))
    zl = sp.Matrix(T, V, lambda t, v: sp.Symbol(f"zl_{t}{v}", real=True))
    mw, ml = sp.symbols("mw0:2", nonnegative=True), sp.symbols("ml0:2", nonnegative=True)
    rw, rl = sp.symbols("r_w r_l", real=True)

    def logp(z, y, m):                                                # Σ_t m_t log softmax(z_t)[y_t]
        return sum(m[t] * (z[t, y[t]] - sp.log(sum(sp.exp(z[t, v]) for v in range(V))))
                   for t in range(T))

    delta = (logp(zw, Y_W, mw) - rw) - (logp(zl, Y_L, ml) - rl)
    L = -sp.log(1 / (1 + sp.exp(-beta * delta)))                      # −log σ(βΔ)
    return L, delta, beta, (zw, mw, Y_W, 1), (zl, ml, Y_L, -1), (rw, rl)


def test_sympy_gradient_wrt_both_sequences_logits_is_the_closed_form():
    L, delta, beta, *seqs, _ = _symbolic_dpo()
    E = sp.Symbol("E", positive=True)                                 # e^{βΔ}: σ(−βΔ) = 1/(1 + E)
    for z, m, y, sign in seqs:
        for t in range(T):
            S = sum(sp.exp(z[t, v]) for v in range(V))
            for v in range(V):
                closed = sign * beta / (1 + E) * m[t] * (sp.exp(z[t, v]) / S - (1 if v == y[t] else 0))
                grad = sp.diff(L, z[t, v]).subs(sp.exp(-beta * delta), 1 / E)
                assert not grad.has(sp.log), "Δ not wholly replaced by E"
                assert sp.cancel(grad - closed) == 0, (t, v)


def test_sympy_gradient_in_numbers_is_dpo_backward():
    L, delta, beta, (zw, mw, _, _), (zl, ml, _, _), (rw, rl) = _symbolic_dpo()
    rng = np.random.default_rng(3)
    zw_, zl_ = rng.standard_normal((1, T, V)), rng.standard_normal((1, T, V))
    mw_, ml_ = np.array([[1, 1]]), np.array([[0, 1]])                 # the rejected one: a prompt position
    ref_w, ref_l, b = np.array([-2.5]), np.array([-1.25]), 0.8
    values = {beta: b, rw: ref_w[0], rl: ref_l[0],
              **dict(zip(zw, zw_.ravel())), **dict(zip(zl, zl_.ravel())),
              **dict(zip(mw, mw_.ravel())), **dict(zip(ml, ml_.ravel()))}
    symbols = list(values)
    f = sp.lambdify(symbols, [L] + [sp.diff(L, s) for s in list(zw) + list(zl)], "numpy")
    out = f(*values.values())
    loss, (dw, dl) = dpo_loss(zw_, np.array([Y_W]), mw_.astype(bool), zl_, np.array([Y_L]),
                              ml_.astype(bool), ref_w, ref_l, b)
    assert abs(loss - out[0]) < 1e-14 * abs(out[0])
    assert rel_error(np.concatenate([dw.ravel(), dl.ravel()]), np.array(out[1:])) < 1e-13
    assert np.all(dl[0, 0] == 0)                                      # the masked position


# --- (c) finite differences ------------------------------------------------------------------------

@pytest.mark.parametrize("seed, beta", [(0, 0.1), (1, 0.7), (2, 3.0)])
def test_finite_differences_with_a_random_upstream_gradient_per_pair(seed, beta):
    inputs, _ = pairs(seed)
    err = check_kernel(dpo_forward, dpo_backward, inputs, wrt=[0, 3], kwargs={"beta": beta}, seed=seed)
    assert err < 1e-7


def test_the_mean_is_the_per_pair_losses_with_one_over_B():
    inputs, beta = pairs(4)
    losses, cache = dpo_forward(*inputs, beta)
    B = losses.shape[0]
    loss, (dw, dl) = dpo_loss(*inputs, beta)
    assert loss == pytest.approx(losses.mean(), rel=1e-15)
    dw2, dl2 = dpo_backward(np.full(B, 1 / B), cache)
    assert np.array_equal(dw, dw2) and np.array_equal(dl, dl2)


def test_prompt_and_padding_positions_count_for_nothing():
    inputs, beta = pairs(5)
    zw, yw, mw, zl, yl, ml = inputs[:6]
    loss, (dw, dl) = dpo_loss(*inputs, beta)
    assert np.all(dw[~mw] == 0) and np.all(dl[~ml] == 0)
    assert np.abs(dw[mw].sum(axis=-1)).max() < 1e-15                  # softmax − onehot sums to 0
    moved = [zw + 100.0 * ~mw[..., None], yw, mw, zl - 50.0 * ~ml[..., None], yl, ml, *inputs[6:]]
    assert dpo_loss(*moved, beta)[0] == loss


def test_float32_in_float32_out():
    inputs, beta = pairs(6, dtype=np.float32)
    losses, cache = dpo_forward(*inputs, beta)
    dw, dl = dpo_backward(np.ones_like(losses), cache)
    assert losses.dtype == dw.dtype == dl.dtype == np.float32
    ref64, _ = dpo_forward(*[x.astype(np.float64) if x.dtype == np.float32 else x for x in inputs], beta)
    assert rel_error(losses, ref64) < 1e-5


# --- (d) PyTorch float64 ---------------------------------------------------------------------------

def test_loss_and_gradients_match_torch_autograd(torch):
    F = torch.nn.functional
    inputs, beta = pairs(7, B=4)
    zw, yw, mw, zl, yl, ml, ref_w, ref_l = inputs
    losses, cache = dpo_forward(*inputs, beta)
    g = np.random.default_rng(8).standard_normal(losses.shape)
    dw, dl = dpo_backward(g, cache)

    def logp(z, y, m):
        lp = torch.log_softmax(z, dim=-1).gather(-1, torch.tensor(np.where(m, y, 0))[..., None])[..., 0]
        return (lp * torch.tensor(m)).sum(dim=1)

    tw = torch.tensor(zw, requires_grad=True)
    tl = torch.tensor(zl, requires_grad=True)
    delta = (logp(tw, yw, mw) - torch.tensor(ref_w)) - (logp(tl, yl, ml) - torch.tensor(ref_l))
    t_losses = -F.logsigmoid(beta * delta)
    t_losses.backward(torch.tensor(g))
    assert rel_error(losses, t_losses.detach().numpy()) < 1e-14
    assert rel_error(dw, tw.grad.numpy()) < 1e-13
    assert rel_error(dl, tl.grad.numpy()) < 1e-13


# --- (e) Hugging Face TRL --------------------------------------------------------------------------

def trl_dpo_loss(torch, dpo_trainer, trl_utils, inputs, beta):
    """TRL's DPO loss (trl 1.16.0, ``trl/trainer/dpo_trainer.py``, ``DPOTrainer._compute_loss``,
    ``loss_type="sigmoid"``: ``-F.logsigmoid(self.beta * delta_score)``, mean over pairs) on our
    logits, and the gradient autograd takes through it.

    TRL computes this loss only inside ``DPOTrainer._compute_loss``, which needs a trainer (a
    transformers model, a tokenizer, a dataset, an accelerator) to construct. The least intrusive
    call: the unbound function, with a stand-in for ``self`` holding the attributes it reads for
    standard DPO (``f_divergence_type="reverse_kl"``, one ``"sigmoid"`` loss, no length
    desensitisation, no weighting, precomputed reference log-probs) and an accelerator whose
    gathers are the identity (one process). The stand-in model returns what TRL's fused LM head
    returns (``add_fused_lm_head`` in ``trl/trainer/utils.py``): per-token log-probabilities of the
    next token, computed by TRL's ``selective_log_softmax``, 0 where the label is −100; the
    entropy, mean logit and top-1 fields feed only TRL's logged metrics. TRL's batch is the chosen
    rows then the rejected rows, padded to one length; its labels are its ``input_ids`` with the
    positions outside ``completion_mask`` set to −100, shifted by one as a causal model's are.
    """
    from types import SimpleNamespace
    from collections import defaultdict
    zw, yw, mw, zl, yl, ml, ref_w, ref_l = inputs
    B, Tmax = zw.shape[0], max(zw.shape[1], zl.shape[1])

    def pad(a, value):
        width = [(0, 0), (0, Tmax - a.shape[1])] + [(0, 0)] * (a.ndim - 2)
        return np.pad(a, width, constant_values=value)

    logits = torch.tensor(np.concatenate([pad(zw, 0.0), pad(zl, 0.0)]), requires_grad=True)
    y = np.concatenate([pad(np.where(mw, yw, 0), 0), pad(np.where(ml, yl, 0), 0)])
    m = np.concatenate([pad(mw, False), pad(ml, False)])
    first = np.zeros((2 * B, 1), np.int64)                            # a prompt token before the response
    batch = {"input_ids": torch.tensor(np.concatenate([first, y], axis=1)),
             "completion_mask": torch.tensor(np.concatenate([first, m], axis=1).astype(np.int64)),
             "ref_chosen_logps": torch.tensor(ref_w), "ref_rejected_logps": torch.tensor(ref_l)}

    class FusedHeadModel:
        training = False

        def __call__(self, input_ids, labels, fused_lm_head, **kwargs):
            assert fused_lm_head
            labels = labels[:, 1:]                                    # the fused head's shift
            lp = trl_utils.selective_log_softmax(logits, labels.clamp(min=0)).masked_fill(labels == -100, 0)
            zeros = torch.zeros_like(lp)
            return SimpleNamespace(log_probs=lp, entropy=zeros, mean_logits=zeros,
                                   is_top1=torch.zeros_like(lp, dtype=torch.bool))

    model = FusedHeadModel()
    identity = lambda x: x                                                       # noqa: E731
    trainer = SimpleNamespace(
        model=model, accelerator=SimpleNamespace(device="cpu", gather=identity, gather_for_metrics=identity),
        aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl",
        loss_types=["sigmoid"], loss_weights=[1.0], beta=beta, use_weighting=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    loss = dpo_trainer.DPOTrainer._compute_loss(trainer, model, batch, return_outputs=False)
    loss.backward()
    grad = logits.grad.numpy()
    return loss.item(), grad[:B, :zw.shape[1]], grad[B:, :zl.shape[1]], trainer._metrics["eval"]


@pytest.mark.torch_parity
@pytest.mark.parametrize("seed, beta", [(9, 0.1), (10, 2.0)])
def test_loss_matches_hugging_face_trl_dpo_sigmoid_loss(torch, seed, beta):
    dpo_trainer = pytest.importorskip("trl.trainer.dpo_trainer")
    trl_utils = pytest.importorskip("trl.trainer.utils")
    inputs, _ = pairs(seed, B=4, T_w=6, T_l=4)
    loss, (dw, dl) = dpo_loss(*inputs, beta)
    trl_loss, trl_dw, trl_dl, metrics = trl_dpo_loss(torch, dpo_trainer, trl_utils, inputs, beta)
    assert abs(loss - trl_loss) <= 1e-14 * abs(trl_loss)
    assert rel_error(dw, trl_dw) < 1e-13 and rel_error(dl, trl_dl) < 1e-13
    # TRL's logged sequence log-probabilities are ours: the same log-probabilities went in
    zw, yw, mw, zl, yl, ml = inputs[:6]
    assert metrics["logps/chosen"][0] == pytest.approx(sequence_logp(zw, yw, mw).mean(), rel=1e-13)
    assert metrics["logps/rejected"][0] == pytest.approx(sequence_logp(zl, yl, ml).mean(), rel=1e-13)


# --- (f) large margins -----------------------------------------------------------------------------

@pytest.mark.parametrize("u", [200.0, -200.0, 1000.0, -1000.0])
def test_large_margins_keep_float64_relative_precision(u):
    """βΔ = ±200 and ±1000: −log σ(βΔ) ≈ e^{−200} or 200, σ(−βΔ) ≈ e^{−1000} or 1, each to float64's
    relative precision (an implementation as −log(σ) rounds σ(200) to 1 and the loss to 0, or
    overflows e^{1000})."""
    inputs, _ = pairs(11, B=1, T_w=4, T_l=3, V=5)
    zw, yw, mw, zl, yl, ml, _, _ = inputs
    lw, ll = sequence_logp(zw, yw, mw), sequence_logp(zl, yl, ml)
    target = 0.5 * np.sign(u)
    ref_w, ref_l = lw - target, ll                                    # Δ = ±0.5, refs ≤ 0
    beta = abs(u) / 0.5
    loss, (dw, dl) = dpo_loss(zw, yw, mw, zl, yl, ml, ref_w, ref_l, beta)
    delta = (lw - ref_w) - (ll - ref_l)                               # the same arithmetic, in float64
    with mpmath.workdps(1000):                                        # 1 + e^{−1000} kept whole
        x = mpmath.mpf(float(beta * delta[0]))
        exact_loss = float(-mpmath.log(1 / (1 + mpmath.exp(-x))))
        exact_sig = float(1 / (1 + mpmath.exp(x)))                    # σ(−βΔ)
    assert abs(loss - exact_loss) <= 1e-13 * exact_loss
    def p_minus_onehot(z, y, m):
        return (softmax(z) - (np.arange(5) == np.where(m, y, 0)[..., None])) * m[..., None]

    weight = beta * exact_sig                                         # times g = 1/B = 1
    assert rel_error(dw, weight * p_minus_onehot(zw, yw, mw)) < 1e-13
    assert rel_error(dl, -weight * p_minus_onehot(zl, yl, ml)) < 1e-13


def test_float32_at_a_margin_of_minus_200_does_not_overflow():
    inputs, _ = pairs(12, B=1, T_w=4, T_l=3, V=5, dtype=np.float32)
    zw, yw, mw, zl, yl, ml, _, _ = inputs
    lw, ll = sequence_logp(zw, yw, mw), sequence_logp(zl, yl, ml)
    ref_w, ref_l = lw + np.float32(0.5), ll                           # Δ = −0.5
    assert (ref_w <= 0).all()
    losses, cache = dpo_forward(zw, yw, mw, zl, yl, ml, ref_w, ref_l, 400.0)
    delta = float((lw - ref_w)[0] - (ll - ref_l)[0])
    assert np.isfinite(losses).all() and losses[0] == pytest.approx(-400.0 * delta, rel=1e-6)
    dw, dl = dpo_backward(np.ones(1, np.float32), cache)
    assert np.isfinite(dw).all() and np.isfinite(dl).all()
    assert cache.sig[0] == 1.0                                        # σ(200) in float32


# --- (g) bad input ---------------------------------------------------------------------------------

def _bad(k, make):
    def edit(args, beta):
        args = list(args)
        return (args, make(beta)) if k == "beta" else (args[:k] + [make(args[k])] + args[k + 1:], beta)
    return edit


BAD = [
    ("beta 0", _bad("beta", lambda b: 0.0), ValueError, r"beta: expected a finite number > 0, got 0\.0"),
    ("beta < 0", _bad("beta", lambda b: -0.1), ValueError, r"beta: .*> 0, got -0\.1"),
    ("beta nan", _bad("beta", lambda b: float("nan")), ValueError, r"beta: .*finite.*got nan"),
    ("beta inf", _bad("beta", lambda b: np.inf), ValueError, r"beta: .*finite.*got inf"),
    ("beta str", _bad("beta", lambda b: "0.1"), TypeError, r"beta: expected a finite number > 0, got str"),
    ("B differs", _bad(3, lambda z: z[:2]), ValueError,
     r"logits_l: expected B = 3 pairs and V = 7 \(from logits_w \(3, 6, 7\)\), got shape \(2, 5, 7\)"),
    ("V differs", _bad(3, lambda z: z[..., :6]), ValueError, r"logits_l: expected B = 3 pairs and V = 7"),
    ("targets shape", _bad(1, lambda y: y[:, :-1]), ValueError,
     r"targets_w: expected shape \(3, 6\) \(from logits_w \(3, 6, 7\)\), got \(3, 5\)"),
    ("mask shape", _bad(5, lambda m: m[:2]), ValueError, r"mask_l: expected shape \(3, 5\) .*got \(2, 5\)"),
    ("mask empty row", _bad(2, lambda m: np.where(np.arange(3)[:, None] == 1, False, m)), ValueError,
     r"mask_w: expected at least one response position \(True\) in every row, got none in row\(s\) \[1\]"),
    ("mask all off", _bad(5, lambda m: np.zeros_like(m)), ValueError, r"mask_l: .*row\(s\) \[0, 1, 2\]"),
    ("mask float", _bad(2, lambda m: m.astype(float)), TypeError,
     r"mask_w: expected a bool .*got dtype float64"),
    ("mask 2", _bad(2, lambda m: m.astype(int) * 2), ValueError,
     r"mask_w: expected values 0 or 1, got \[0, 2\]"),
    ("target out of range", _bad(4, lambda y: np.where(y >= 0, 7, y)), ValueError,
     r"targets_l: expected values in \[0, 7\) on the response positions, got min 7 and max 7"),
    ("logits nan", _bad(0, lambda z: np.where(np.arange(7) == 2, np.nan, z)), ValueError,
     r"logits_w: expected finite values, got 18 NaN or ±inf"),
    ("ref shape", _bad(6, lambda r: r[:2]), ValueError,
     r"ref_logp_w: expected shape \(3,\) \(one per pair\), got \(2,\)"),
    ("ref positive", _bad(7, lambda r: -r), ValueError,
     r"ref_logp_l: expected finite log-probabilities ≤ 0"),
    ("ref nan", _bad(6, lambda r: np.full_like(r, np.nan)), ValueError, r"ref_logp_w: expected finite"),
    ("dtypes differ", _bad(3, lambda z: z.astype(np.float32)), TypeError,
     r"dtype mismatch: .*logits_l=float32"),
    ("no pairs", _bad(0, lambda z: z[:0]), ValueError, r"logits_w: expected at least one pair \(B ≥ 1\)"),
    ("logits 2-D", _bad(0, lambda z: z[0]), ValueError, r"logits_w: expected 3 dimensions"),
]


@pytest.mark.parametrize("name, edit, error, words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_argument_what_was_expected_and_what_came(name, edit, error, words):
    args, beta = edit(*pairs(13))
    with pytest.raises(error, match=words):
        dpo_loss(*args, beta)


def test_bad_upstream_gradient_and_bad_sequence_logp_input():
    inputs, beta = pairs(14)
    _, cache = dpo_forward(*inputs, beta)
    with pytest.raises(ValueError, match=r"dlosses: expected shape \(3,\) \(one per pair\), got \(4,\)"):
        dpo_backward(np.ones(4), cache)
    zw, yw, mw = inputs[:3]
    with pytest.raises(ValueError, match=r"mask: expected at least one response position .*\[0\]"):
        sequence_logp(zw, yw, np.where(np.arange(3)[:, None] == 0, False, mw))
    assert sequence_logp(zw, yw, mw).shape == (3,)                    # −100 off the mask is fine
