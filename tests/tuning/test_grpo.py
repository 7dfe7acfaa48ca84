"""The GRPO loss (tformer.tuning.grpo), checked the book's three ways and against Hugging Face TRL.

(a) Finite differences in float64, with a random upstream gradient per response, of the loss with
    respect to the token log-probabilities and to the logits, for every loss type and both
    importance levels, ≤ 1e-10 relative. Plain central differences bottom out near 1e-8 in float64
    (rounding ε|L|/h against truncation h²); a fourth-order five-point stencil at h = 1e-3 reaches
    ~1e-12. Every ratio is kept 5e-3 from a clip boundary (a stencil moves a log-probability by
    up to 2h, a ratio near a boundary by < 1.3·2h), so no stencil crosses a kink.
(b) PyTorch float64 autograd on the same inputs. (c) TRL 1.16's ``GRPOTrainer._compute_loss``
    (``trl/trainer/grpo_trainer.py``) on the same per-token log-probabilities, advantages and
    masks, every loss type × importance level × β, to rounding, and the gradient autograd takes
    through it; the group advantage against torch's std and TRL's ``nanstd``. (d) Bad input. (e) SymPy: k3 ≥ 0 and unbiased, the score-function identity and the
    baseline, the clipped surrogate's gradient region by region, and a whole symbolic loss.
    (b) and (c) are parity tests: a skip fails the run (tests/conftest.py).
"""
import contextlib
import types
from collections import defaultdict

import numpy as np
import pytest
import sympy as sp

from tformer.core.gradcheck import rel_error
from tformer.tuning.grpo import (LOSS_TYPES, grpo_backward, grpo_forward, grpo_loss, group_advantages,
                                 token_logp, token_logp_backward)

LEVELS = ("token", "sequence")
EPS_LOW, EPS_HIGH = 0.2, 0.28
H = 1e-3                                                              # the stencil's step


def responses(seed=0, B=2, G=4, T=6, V=5, dtype=np.float64, spread=0.35):
    """B prompts × G responses of up to T tokens: logits, targets, a mask with trailing padding
    (lengths 2..T, pad target −100), the old and reference policies' token log-probabilities (the
    logits moved by noise of scale ``spread``, and the old one's target logit by a shift per
    response: ratios on both sides of both clip edges at both levels) and group-normalised
    advantages of random rewards."""
    rng = np.random.default_rng(seed)
    N = B * G
    z = (1.5 * rng.standard_normal((N, T, V))).astype(dtype)
    lengths = rng.integers(2, T + 1, N)
    mask = np.arange(T) < lengths[:, None]
    y = np.where(mask, rng.integers(0, V, (N, T)), -100)
    shift = 0.5 * rng.standard_normal((N, 1, 1)) * (np.arange(V) == np.maximum(y, 0)[..., None])
    old, _ = token_logp((z + spread * rng.standard_normal(z.shape) + shift).astype(dtype), y, mask)
    ref, _ = token_logp((z + 0.5 * rng.standard_normal(z.shape)).astype(dtype), y, mask)
    A = group_advantages(rng.standard_normal((B, G)).astype(dtype))
    return z, y, mask, old, ref, A


def options(loss_type, level, beta, T=6):
    return dict(loss_type=loss_type, level=level, eps_low=EPS_LOW, eps_high=EPS_HIGH, beta=beta,
                max_len=T + 3, num_items=57)


def far_from_the_clip(logp, old, mask, level, margin):
    """Every ratio's distance to 1 − ε_low and 1 + ε_high exceeds ``margin``."""
    r = np.where(mask, logp - old, 0)
    if level == "sequence":
        r = r.sum(axis=1) / mask.sum(axis=1)
    rho = np.exp(r)[mask] if level == "token" else np.exp(r)
    return min(np.abs(rho - (1 - EPS_LOW)).min(), np.abs(rho - (1 + EPS_HIGH)).min()) > margin


def stencil(f, x, h=H):
    """∂f/∂x by the five-point stencil (−f(x+2h) + 8f(x+h) − 8f(x−h) + f(x−2h)) / 12h, every entry."""
    out = np.empty(x.size)
    flat = x.reshape(-1)
    for i in range(x.size):
        old = flat[i]
        vals = []
        for k in (2, 1, -1, -2):
            flat[i] = old + k * h
            vals.append(f())
        flat[i] = old
        out[i] = (-vals[0] + 8 * vals[1] - 8 * vals[2] + vals[3]) / (12 * h)
    return out.reshape(x.shape)


# --- (a) finite differences ------------------------------------------------------------------------

CASES = [(t, lv, b) for t in LOSS_TYPES for lv in LEVELS for b in (0.0, 0.1)]


@pytest.mark.parametrize("loss_type, level, beta", CASES)
def test_finite_differences_wrt_log_probabilities_and_logits(loss_type, level, beta):
    z, y, mask, old, ref, A = responses(seed=1)
    logp, cache_z = token_logp(z, y, mask)
    assert far_from_the_clip(logp, old, mask, level, 5e-3)
    opts = options(loss_type, level, beta)
    g = np.random.default_rng(2).standard_normal(A.shape)             # one upstream gradient per response
    losses, cache = grpo_forward(logp, old, ref, mask, A, **opts)
    dlogp = grpo_backward(g, cache)
    dz = token_logp_backward(dlogp, cache_z)
    x = logp.copy()
    num = stencil(lambda: float(g @ grpo_forward(x, old, ref, mask, A, **opts)[0]), x)
    assert rel_error(dlogp, num) <= 1e-10
    num_z = stencil(lambda: float(g @ grpo_forward(token_logp(z, y, mask)[0], old, ref, mask, A, **opts)[0]), z)
    assert rel_error(dz, num_z) <= 1e-10
    assert np.all(dlogp[~mask] == 0) and np.all(dz[~mask] == 0)       # padding: no gradient
    clipped = cache.clipped[mask] if level == "token" else cache.clipped
    assert 0 < clipped.sum() < clipped.size                            # the clip binds, not everywhere


# --- the loss's own properties ---------------------------------------------------------------------

def test_the_gradient_is_zero_where_the_clip_binds_and_rho_A_elsewhere():
    z, y, mask, old, ref, A = responses(seed=3, B=4, G=4)
    logp, _ = token_logp(z, y, mask)
    for level in LEVELS:
        _, cache = grpo_forward(logp, old, None, mask, A, loss_type="luspo", level=level,
                                eps_low=EPS_LOW, eps_high=EPS_HIGH)
        rho = np.broadcast_to(cache.ratio, mask.shape)
        clipped = np.broadcast_to(cache.clipped, mask.shape) & mask
        N = mask.shape[0]
        high = (rho > 1 + EPS_HIGH) & (A[:, None] > 0) & mask
        low = (rho < 1 - EPS_LOW) & (A[:, None] < 0) & mask
        assert high.any() and low.any()
        assert np.array_equal(clipped, high | low)
        assert np.all(cache.dlogp[clipped] == 0)
        free = mask & ~clipped                                        # w_i = 1/N for luspo
        assert rel_error(cache.dlogp[free], -(rho * A[:, None])[free] / N) < 1e-15


def test_normalisations_relate_as_the_module_says():
    z, y, mask, old, ref, A = responses(seed=4)
    logp, _ = token_logp(z, y, mask)
    N, T = mask.shape
    L = {t: grpo_loss(logp, old, ref, mask, A, loss_type=t, beta=0.05) for t in LOSS_TYPES}
    n = mask.sum()
    assert L["dapo"][0] == pytest.approx(L["bnpo"][0], rel=1e-14)     # num_items: this batch's tokens
    assert L["dr_grpo"][0] == pytest.approx(L["bnpo"][0] * n / (N * T), rel=1e-14)
    assert L["luspo"][0] == pytest.approx(L["dr_grpo"][0] * T, rel=1e-14)
    full = np.ones_like(mask)                                         # equal lengths: grpo is bnpo
    lp_full, _ = token_logp(z, np.where(full, np.maximum(y, 0), 0), full)
    a = grpo_loss(lp_full, lp_full - 0.01, None, full, A, loss_type="grpo")
    b = grpo_loss(lp_full, lp_full - 0.01, None, full, A, loss_type="bnpo")
    assert a[0] == pytest.approx(b[0], rel=1e-14) and rel_error(a[1], b[1]) < 1e-15


def test_on_policy_default_and_padding_values():
    z, y, mask, old, ref, A = responses(seed=5)
    logp, _ = token_logp(z, y, mask)
    a = grpo_loss(logp, None, ref, mask, A, beta=0.1)
    b = grpo_loss(logp, logp.copy(), ref, mask, A, beta=0.1)
    assert a[0] == b[0] and np.array_equal(a[1], b[1])
    # on policy, ρ = 1: L = −mean_i A_i + β·(mean of each response's mean k3), ∂L/∂log π = −A/(N|o|) + ...
    N, n = mask.shape[0], mask.sum(axis=1)
    _, cache = grpo_forward(logp, None, ref, mask, A, beta=0.1)
    assert a[0] == pytest.approx(-A.mean() + 0.1 * np.mean(cache.kl.sum(axis=1) / n), rel=1e-13, abs=1e-15)
    junk = np.where(mask, logp, 7.0)                                  # values off the mask are ignored
    c = grpo_loss(junk, np.where(mask, old, np.nan), np.where(mask, ref, -1e9), mask, A, beta=0.1,
                  level="sequence")
    d = grpo_loss(logp, old, ref, mask, A, beta=0.1, level="sequence")
    assert c[0] == d[0] and np.array_equal(c[1], d[1])


def test_grpo_loss_is_the_forward_summed_and_the_backward_with_ones():
    z, y, mask, old, ref, A = responses(seed=6)
    logp, _ = token_logp(z, y, mask)
    losses, cache = grpo_forward(logp, old, ref, mask, A, beta=0.2, level="sequence")
    L, d = grpo_loss(logp, old, ref, mask, A, beta=0.2, level="sequence")
    assert L == pytest.approx(losses.sum(), rel=1e-15)
    assert np.array_equal(d, grpo_backward(np.ones_like(losses), cache))


def test_float32_in_float32_out():
    z, y, mask, old, ref, A = responses(seed=7)
    f32 = [x.astype(np.float32) for x in (z, old, ref, A)]
    logp, cz = token_logp(f32[0], y, mask)
    losses, cache = grpo_forward(logp, f32[1], f32[2], mask, f32[3], beta=0.1)
    d = grpo_backward(np.ones_like(losses), cache)
    dz = token_logp_backward(d, cz)
    assert logp.dtype == losses.dtype == d.dtype == dz.dtype == np.float32
    lp64, _ = token_logp(z, y, mask)
    ref64, c64 = grpo_forward(lp64, old, ref, mask, A, beta=0.1)
    assert rel_error(losses, ref64) < 1e-5 and rel_error(d, c64.dlogp) < 1e-5


def test_group_advantages_scales():
    r = np.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [3.0, 1.0, 2.0, 6.0]])
    A = group_advantages(r).reshape(3, 4)
    assert np.all(A[1] == 0)                                          # no spread, no signal
    assert np.abs(A.reshape(3, 4).sum(axis=1)).max() < 1e-15          # zero mean per group
    s = np.std([1.0, 0, 0, 1], ddof=1)
    assert np.allclose(A[0], (r[0] - 0.5) / (s + 1e-4), rtol=1e-15, atol=0)
    assert np.array_equal(group_advantages(r, scale="none").reshape(3, 4), r - r.mean(axis=1, keepdims=True))
    Ab = group_advantages(r, scale="batch", eps=1e-6).reshape(3, 4)
    assert np.allclose(Ab, (r - r.mean(axis=1, keepdims=True)) / (r.std(ddof=1) + 1e-6), rtol=1e-15, atol=0)


# --- (b) PyTorch float64 ---------------------------------------------------------------------------

def torch_grpo(torch, z, y, mask, old, ref, A, loss_type, level, eps_low, eps_high, beta, max_len, num_items):
    """The loss written afresh in torch, one share per response: the oracle for autograd."""
    m = torch.tensor(mask, dtype=torch.float64)
    lp = torch.log_softmax(z, -1).gather(-1, torch.tensor(np.where(mask, y, 0))[..., None])[..., 0] * m
    r = (lp - torch.tensor(old)) * m
    if level == "sequence":
        r = (r.sum(1) / m.sum(1))[:, None]
    rho, At = torch.exp(r), torch.tensor(A)[:, None]
    ell = -torch.minimum(rho * At, torch.clamp(rho, 1 - eps_low, 1 + eps_high) * At)
    u = torch.tensor(ref) - lp
    ell = ell + beta * (torch.exp(u) - u - 1)
    N, T = mask.shape
    n = m.sum(1)
    w = {"grpo": 1 / (N * n), "bnpo": 1 / n.sum() + 0 * n, "dr_grpo": 1 / (N * max_len) + 0 * n,
         "dapo": 1 / num_items + 0 * n, "luspo": 1 / N + 0 * n}[loss_type]
    return w * (ell * m).sum(1), lp


@pytest.mark.parametrize("loss_type, level, beta", CASES)
def test_loss_and_gradients_match_torch_autograd(torch, loss_type, level, beta):
    z, y, mask, old, ref, A = responses(seed=8, B=3, G=3, T=7, V=6)
    opts = options(loss_type, level, beta, T=7)
    logp, cz = token_logp(z, y, mask)
    losses, cache = grpo_forward(logp, old, ref, mask, A, **opts)
    g = np.random.default_rng(9).standard_normal(losses.shape)
    dlogp = grpo_backward(g, cache)
    dz = token_logp_backward(dlogp, cz)
    tz = torch.tensor(z, requires_grad=True)
    t_losses, t_lp = torch_grpo(torch, tz, y, mask, old, ref, A, **opts)
    t_lp.retain_grad()
    t_losses.backward(torch.tensor(g))
    assert rel_error(losses, t_losses.detach().numpy()) < 1e-14
    assert rel_error(dlogp, t_lp.grad.numpy() * mask) < 1e-14
    assert rel_error(dz, tz.grad.numpy()) < 1e-14


# --- (c) Hugging Face TRL --------------------------------------------------------------------------

def trl_grpo_loss(torch, z, y, mask, old, ref, A, loss_type, level, eps_low, eps_high, beta, max_len, num_items):
    """TRL's GRPO loss (trl 1.16.0, ``trl/trainer/grpo_trainer.py``: ``GRPOTrainer._compute_loss``,
    line 3020, with ``_get_per_token_logps_and_entropies``, line 1419) on our logits, the gradient
    autograd takes through it, and the metrics it logs.

    ``_compute_loss`` needs a trainer (a transformers model, a dataset, an accelerator) to be built.
    The least intrusive call: the unbound functions with a stand-in for ``self`` holding the
    attributes they read (no entropy mask or bonus, no off-policy mask, no vLLM, no ``delta``, no
    KL bias correction, eval mode: no gradient-accumulation divisor) and an accelerator of one
    process. The stand-in model returns what TRL's fused LM head (``add_fused_lm_head``,
    ``trl/trainer/utils.py``) returns: each label's log-probability by TRL's
    ``selective_log_softmax``, 0 where the label is −100, the labels shifted by one. TRL's batch
    is a one-token prompt and the completion; positions outside ``completion_mask`` get label −100.
    """
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import selective_log_softmax
    N, T, _ = z.shape
    logits = torch.tensor(z, requires_grad=True)

    class FusedHeadModel:
        training = False

        def __call__(self, input_ids, attention_mask, labels, fused_lm_head, **kwargs):
            assert fused_lm_head and input_ids.shape == (N, 1 + T)
            labels = labels[:, 1:]                                    # the fused head's shift
            lp = selective_log_softmax(logits, labels.clamp(min=0)).masked_fill(labels == -100, 0)
            return types.SimpleNamespace(log_probs=lp, entropy=torch.zeros_like(lp))

    model = FusedHeadModel()
    identity = lambda x: x                                                       # noqa: E731
    accelerator = types.SimpleNamespace(autocast=contextlib.nullcontext, gather=identity,
                                        reduce=lambda x, reduction: x, num_processes=1, is_main_process=False)
    trainer = types.SimpleNamespace(
        model=model, accelerator=accelerator, aux_loss_enabled=False, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, importance_sampling_level=level, loss_type=loss_type,
        epsilon_low=eps_low, epsilon_high=eps_high, beta=beta, use_vllm=False,
        max_completion_length=max_len, _entropy_bonus_enabled=False,
        args=types.SimpleNamespace(use_bias_correction_kl=False, delta=None),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    trainer._get_per_token_logps_and_entropies = types.MethodType(
        GRPOTrainer._get_per_token_logps_and_entropies, trainer)
    inputs = {"prompt_ids": torch.zeros((N, 1), dtype=torch.long),
              "prompt_mask": torch.ones((N, 1), dtype=torch.long),
              "completion_ids": torch.tensor(np.where(mask, y, 0)),
              "completion_mask": torch.tensor(mask.astype(np.int64)),
              "advantages": torch.tensor(A), "old_per_token_logps": torch.tensor(old),
              "ref_per_token_logps": torch.tensor(ref), "num_items_in_batch": torch.tensor(float(num_items))}
    loss = GRPOTrainer._compute_loss(trainer, model, inputs)
    loss.backward()
    return loss.item(), logits.grad.numpy(), trainer._metrics["eval"]


@pytest.mark.torch_parity
@pytest.mark.parametrize("loss_type, level, beta", CASES)
def test_loss_and_gradient_match_hugging_face_trl_grpo_trainer(torch, loss_type, level, beta):
    pytest.importorskip("trl.trainer.grpo_trainer")
    z, y, mask, old, ref, A = responses(seed=10, B=3, G=4, T=7, V=6)
    opts = options(loss_type, level, beta, T=7)
    logp, cz = token_logp(z, y, mask)
    L, dlogp = grpo_loss(logp, old, ref, mask, A, **opts)
    _, cache = grpo_forward(logp, old, ref, mask, A, **opts)
    dz = token_logp_backward(dlogp, cz)
    trl_loss, trl_dz, metrics = trl_grpo_loss(torch, z, y, mask, old, ref, A, **opts)
    assert abs(L - trl_loss) <= 1e-14 * abs(trl_loss)
    assert rel_error(dz, trl_dz) < 1e-13
    # what TRL logs is what the cache holds: the KL and the share of ratios clipped (TRL counts the
    # tokens and the clipped ones in float32: ``mask.sum().float()``, ``is_region_clipped.float()``)
    if beta:
        assert metrics["kl"][0] == pytest.approx(cache.kl[mask].mean(), rel=1e-6)
    clipped = cache.clipped[mask] if level == "token" else cache.clipped
    assert 0 < clipped.mean() < 1
    assert metrics["clip_ratio/region_mean"][0] == pytest.approx(clipped.mean(), rel=1e-6)


@pytest.mark.torch_parity
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_torch_and_trl_nanstd(torch, scale):
    """Against torch's unbiased std in float64, to rounding; against TRL's ``nanstd``
    (``trl/trainer/utils.py``) to 1e-7: its Bessel factor ``count / (count - 1)`` divides two
    integer tensors, which torch does in float32."""
    trl_utils = pytest.importorskip("trl.trainer.utils")
    r = np.random.default_rng(11).standard_normal((5, 4))
    t = torch.tensor(r)
    A = group_advantages(r, scale=scale)
    mean = t.mean(dim=1, keepdim=True)
    for std_fn, tol in ((lambda x, **kw: torch.std(x, unbiased=True, **kw), 1e-15), (trl_utils.nanstd, 1e-7)):
        std = std_fn(t, dim=1, keepdim=True) if scale == "group" else std_fn(t)
        expected = (t - mean) / (std + 1e-4) if scale != "none" else t - mean
        assert rel_error(A, expected.reshape(-1).numpy()) < tol


# --- (d) bad input ---------------------------------------------------------------------------------

def _args():
    z, y, mask, old, ref, A = responses(seed=12)
    logp, _ = token_logp(z, y, mask)
    return [logp, old, ref, mask, A], {"beta": 0.1}


def _arg(k, make):
    def edit(args, kw):
        args, kw = list(args), dict(kw)
        if isinstance(k, int):
            args[k] = make(args[k])
        else:
            kw[k] = make(kw.get(k))
        return args, kw
    return edit


BAD = [
    ("loss_type", _arg("loss_type", lambda _: "ppo"), ValueError,
     r"loss_type: expected one of \('grpo', 'bnpo', 'dr_grpo', 'dapo', 'luspo'\), got 'ppo'"),
    ("level", _arg("level", lambda _: "tokens"), ValueError, r"level: expected one of .*got 'tokens'"),
    ("eps_low 1", _arg("eps_low", lambda _: 1.0), ValueError, r"eps_low: expected a finite number ≥ 0 and < 1, got 1\.0"),
    ("eps_low < 0", _arg("eps_low", lambda _: -0.1), ValueError, r"eps_low: .*got -0\.1"),
    ("eps_high nan", _arg("eps_high", lambda _: float("nan")), ValueError, r"eps_high: expected a finite number ≥ 0, got nan"),
    ("eps_high str", _arg("eps_high", lambda _: "0.2"), TypeError, r"eps_high: expected a finite number ≥ 0, got str"),
    ("beta < 0", _arg("beta", lambda _: -1.0), ValueError, r"beta: expected a finite number ≥ 0, got -1\.0"),
    ("beta bool", _arg("beta", lambda _: True), TypeError, r"beta: .*got bool"),
    ("max_len short", _arg("max_len", lambda _: 5), ValueError, r"max_len: expected an integer ≥ 6, got 5"),
    ("max_len float", _arg("max_len", lambda _: 9.0), TypeError, r"max_len: expected an integer ≥ 6, got float"),
    ("num_items 0", _arg("num_items", lambda _: 0), ValueError, r"num_items: expected a finite number > 0, got 0"),
    ("logp list", _arg(0, lambda x: x.tolist()), TypeError, r"logp: expected a NumPy float32/float64 array, got list"),
    ("logp 1-D", _arg(0, lambda x: x[0]), ValueError, r"logp: expected 2 dimensions, got shape \(6,\)"),
    ("logp empty", _arg(0, lambda x: x[:0]), ValueError, r"logp: expected at least one response \(N ≥ 1\)"),
    ("logp positive", _arg(0, lambda x: x + 5), ValueError,
     r"logp: expected finite log-probabilities ≤ 0 on the mask, got min .* and max "),
    ("logp_old shape", _arg(1, lambda x: x[:, :-1]), ValueError,
     r"logp_old: expected shape \(8, 6\) \(from logp\), got \(8, 5\)"),
    ("logp_old nan", _arg(1, lambda x: np.where(np.arange(6) == 0, np.nan, x)), ValueError,
     r"logp_old: expected finite log-probabilities ≤ 0 on the mask"),
    ("logp_ref missing", _arg(2, lambda x: None), ValueError,
     r"logp_ref: expected the reference's log-probabilities \(N, T\) when beta > 0 \(beta = 0\.1\), got None"),
    ("logp_ref int", _arg(2, lambda x: x.astype(int)), TypeError, r"logp_ref: expected dtype float32, float64"),
    ("mask shape", _arg(3, lambda m: m[:4]), ValueError, r"mask: expected shape \(8, 6\) \(from logp\), got \(4, 6\)"),
    ("mask list", _arg(3, lambda m: m.tolist()), ValueError, r"mask: expected shape \(8, 6\) \(from logp\), got list"),
    ("mask float", _arg(3, lambda m: m.astype(float)), TypeError, r"mask: expected a bool .*got dtype float64"),
    ("mask 2", _arg(3, lambda m: m * 2), ValueError, r"mask: expected values 0 or 1, got \[0, 2\]"),
    ("mask empty row", _arg(3, lambda m: np.where(np.arange(8)[:, None] == 3, False, m)), ValueError,
     r"mask: expected at least one response token \(True\) in every row, got none in row\(s\) \[3\]"),
    ("advantages shape", _arg(4, lambda a: a[:-1]), ValueError,
     r"advantages: expected shape \(8,\) \(one per response\), got \(7,\)"),
    ("advantages inf", _arg(4, lambda a: a / 0), ValueError, r"advantages: expected finite values, got \d NaN or ±inf"),
    ("dtypes differ", _arg(4, lambda a: a.astype(np.float32)), TypeError, r"dtype mismatch: .*advantages=float32"),
]


@pytest.mark.parametrize("name, edit, error, words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_argument_what_was_expected_and_what_came(name, edit, error, words):
    with np.errstate(divide="ignore", invalid="ignore"):
        args, kw = edit(*_args())
    with pytest.raises(error, match=words):
        grpo_forward(*args, **kw)


def test_bad_input_of_the_other_functions():
    args, kw = _args()
    _, cache = grpo_forward(*args, **kw)
    with pytest.raises(ValueError, match=r"dlosses: expected shape \(8,\) \(one per response\), got \(4,\)"):
        grpo_backward(np.ones(4), cache)
    z, y, mask, *_ = responses(seed=12)
    with pytest.raises(ValueError, match=r"logits: expected at least one response \(N ≥ 1\), got shape \(0, 6, 5\)"):
        token_logp(z[:0], y[:0], mask[:0])
    with pytest.raises(ValueError, match=r"targets: expected values in \[0, 5\) on the response positions"):
        token_logp(z, np.where(mask, 5, y), mask)
    _, cz = token_logp(z, y, mask)
    with pytest.raises(ValueError, match=r"dlogp: expected shape \(8, 6\) \(the log-probabilities'\), got \(8, 5\)"):
        token_logp_backward(np.ones((8, 5)), cz)
    r = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"rewards: expected B ≥ 1 groups of G ≥ 2 responses, got shape \(2, 1\)"):
        group_advantages(r[:, :1])
    with pytest.raises(ValueError, match=r"rewards: expected finite values, got 1 NaN or ±inf"):
        group_advantages(np.where(np.eye(2, 3) * np.arange(2)[:, None] > 0, np.nan, r))
    with pytest.raises(ValueError, match=r"scale: expected one of \('group', 'batch', 'none'\), got 'std'"):
        group_advantages(r, scale="std")
    with pytest.raises(ValueError, match=r"eps: expected a finite number > 0, got 0"):
        group_advantages(r, eps=0)
    with pytest.raises(TypeError, match=r"rewards: expected a NumPy float32/float64 array, got list"):
        group_advantages([[1.0, 2.0]])


# --- (e) SymPy: the algebra ------------------------------------------------------------------------

def test_sympy_k3_is_never_negative_and_zero_only_at_u_0():
    u = sp.Symbol("u", real=True)
    k3 = sp.exp(u) - u - 1
    assert sp.solve(sp.diff(k3, u), u) == [0]                         # one stationary point
    assert k3.subs(u, 0) == 0
    assert sp.diff(k3, u, 2).is_positive                              # convex: the minimum, 0
    assert sp.calculus.util.minimum(k3, u, sp.S.Reals) == 0


def test_sympy_k3_is_an_unbiased_estimate_of_kl():
    """E_{y∼π}[k3(log π_ref(y) − log π(y))] = KL(π ‖ π_ref), symbolically on three outcomes, and
    in exact rationals; the naive k1 = −u is unbiased too, k2 = u²/2 is not."""
    p1, p2, q1, q2 = sp.symbols("p1 p2 q1 q2", positive=True)
    p, q = (p1, p2, 1 - p1 - p2), (q1, q2, 1 - q1 - q2)
    k3 = lambda pi, ref: ref / pi - sp.log(ref / pi) - 1               # noqa: E731  e^u − u − 1
    E_k3 = sum(pi * k3(pi, ref) for pi, ref in zip(p, q))
    KL = sum(pi * sp.log(pi / ref) for pi, ref in zip(p, q))
    assert sp.simplify(sp.expand(sp.expand_log(E_k3 - KL, force=True))) == 0
    P, Q = (sp.Rational(1, 2), sp.Rational(1, 3), sp.Rational(1, 6)), (sp.Rational(1, 5), sp.Rational(3, 5), sp.Rational(1, 5))
    e_k3 = sum(a * k3(a, b) for a, b in zip(P, Q))
    kl = sum(a * sp.log(a / b) for a, b in zip(P, Q))
    assert sp.simplify(e_k3 - kl) == 0 and kl.evalf() > 0
    e_k2 = sum(a * sp.log(b / a) ** 2 / 2 for a, b in zip(P, Q))
    assert abs((e_k2 - kl).evalf()) > 1e-3


def test_sympy_score_function_identity_and_the_baseline_on_a_softmax_policy():
    """π = softmax(θ) over four outcomes with rewards r: ∇_θ E_π[r] = E_π[r ∇ log π] exactly,
    E_π[b ∇ log π] = 0 for a constant b, and the variance of (r − b)∂log π/∂θ_k is a quadratic in b
    minimised at b* = E[r (∂log π)²] / E[(∂log π)²]."""
    K = 4
    th = sp.symbols(f"theta0:{K}", real=True)
    r = sp.symbols(f"r0:{K}", real=True)
    b = sp.Symbol("b", real=True)
    Z = sum(sp.exp(t) for t in th)
    pi = [sp.exp(t) / Z for t in th]
    logpi = [t - sp.log(Z) for t in th]
    J = sum(pi[y] * r[y] for y in range(K))
    for k in range(K):
        score = [sp.diff(logpi[y], th[k]) for y in range(K)]
        assert sp.simplify(sp.diff(J, th[k]) - sum(pi[y] * r[y] * score[y] for y in range(K))) == 0
        assert sp.simplify(sum(pi[y] * b * score[y] for y in range(K))) == 0
        second = sum(pi[y] * ((r[y] - b) * score[y]) ** 2 for y in range(K))   # E[X²]; E[X] fixed
        (b_star,) = sp.solve(sp.diff(second, b), b)
        best = sum(pi[y] * r[y] * score[y] ** 2 for y in range(K)) / sum(pi[y] * score[y] ** 2 for y in range(K))
        assert sp.simplify(b_star - best) == 0
        assert sp.simplify(sp.diff(second, b, 2) - 2 * sum(pi[y] * score[y] ** 2 for y in range(K))) == 0


REGIONS = [  # (A, ρ): the six regions of the clipped surrogate
    (1.5, 1.5), (1.5, 1.1), (1.5, 0.5), (-1.5, 1.5), (-1.5, 1.1), (-1.5, 0.5)]


def test_sympy_the_clipped_surrogate_gradient_region_by_region():
    """s(x) = min(e^{x−o} A, clip(e^{x−o}, 1 − ε_l, 1 + ε_h) A), differentiated by SymPy through
    Min and Max, is 0 where the clip binds (ρ > 1 + ε_h with A > 0, ρ < 1 − ε_l with A < 0) and ρA
    elsewhere; and so is grpo_forward's gradient, at each region's point."""
    x = sp.Symbol("x", real=True)
    o, A_, el, eh = sp.symbols("o A epsilon_l epsilon_h", real=True)
    rho = sp.exp(x - o)
    s = sp.Min(rho * A_, sp.Min(sp.Max(rho, 1 - el), 1 + eh) * A_)
    ds = sp.diff(s, x)
    for A, r in REGIONS:
        values = {x: sp.log(sp.Rational(r).limit_denominator(10)), o: 0, A_: sp.Rational(A), el: sp.Rational(1, 5),
                  eh: sp.Rational(7, 25)}
        binds = (A > 0 and r > 1 + 0.28) or (A < 0 and r < 1 - 0.2)
        expected = 0 if binds else sp.Rational(r).limit_denominator(10) * sp.Rational(A)
        assert sp.simplify(ds.subs(values)) == expected, (A, r)
        logp, old = np.array([[np.log(r)]]), np.zeros((1, 1))
        _, cache = grpo_forward(logp - 1, old - 1, None, np.ones((1, 1), bool), np.array([A]),
                                loss_type="luspo", eps_low=0.2, eps_high=0.28)
        assert cache.clipped[0, 0] == binds
        assert cache.dlogp[0, 0] == pytest.approx(-float(expected), rel=1e-15, abs=0)


def _symbolic_loss(loss_type, level, beta, lengths, T, max_len=9, num_items=7):
    """The whole loss for N = len(lengths) responses of T tokens with symbolic log-probabilities x."""
    N = len(lengths)
    x = sp.Matrix(N, T, lambda i, t: sp.Symbol(f"x_{i}{t}", real=True))
    o = sp.Matrix(N, T, lambda i, t: sp.Symbol(f"o_{i}{t}", real=True))
    q = sp.Matrix(N, T, lambda i, t: sp.Symbol(f"q_{i}{t}", real=True))
    A = sp.symbols(f"A0:{N}", real=True)
    m = [[1 if t < lengths[i] else 0 for t in range(T)] for i in range(N)]
    L = 0
    for i in range(N):
        n = lengths[i]
        seq = sp.exp(sum(x[i, t] - o[i, t] for t in range(n)) / n)
        w = {"grpo": sp.Rational(1, N * n), "bnpo": sp.Rational(1, sum(lengths)),
             "dr_grpo": sp.Rational(1, N * max_len), "dapo": sp.Rational(1, num_items),
             "luspo": sp.Rational(1, N)}[loss_type]
        for t in range(T):
            if not m[i][t]:
                continue
            rho = seq if level == "sequence" else sp.exp(x[i, t] - o[i, t])
            s = sp.Min(rho * A[i], sp.Min(sp.Max(rho, sp.Rational(4, 5)), sp.Rational(32, 25)) * A[i])
            u = q[i, t] - x[i, t]
            L += w * (-s + beta * (sp.exp(u) - u - 1))
    return L, x, o, q, A, np.array(m, bool)


@pytest.mark.parametrize("loss_type, level", [(t, lv) for t in LOSS_TYPES for lv in LEVELS])
def test_sympy_whole_loss_and_gradient_in_numbers_is_grpo_loss(loss_type, level):
    lengths, T, beta = (3, 1, 2), 3, sp.Rational(1, 10)
    L, x, o, q, A, mask = _symbolic_loss(loss_type, level, beta, lengths, T)
    rng = np.random.default_rng(13)
    xv = -rng.uniform(0.7, 2.5, (3, T))
    ov = xv + rng.choice([-0.5, 0.0, 0.5], (3, T)) + rng.uniform(-0.05, 0.05, (3, T))
    qv = -rng.uniform(0.2, 2.0, (3, T))
    Av = np.array([0.9, -1.3, 0.4])
    values = {s: sp.Float(v, 30) for s, v in zip([*x, *o, *q, *A], [*xv.ravel(), *ov.ravel(), *qv.ravel(), *Av])}
    out = [float(e.xreplace(values)) for e in [L] + [sp.diff(L, s) for s in x]]   # at 30 digits
    loss, d = grpo_loss(xv, ov, qv, mask, Av, loss_type=loss_type, level=level, eps_low=0.2,
                        eps_high=0.28, beta=0.1, max_len=9, num_items=7)
    assert abs(loss - out[0]) <= 1e-14 * abs(out[0])
    assert rel_error(d.ravel(), np.array(out[1:], float) * mask.ravel()) < 1e-14
