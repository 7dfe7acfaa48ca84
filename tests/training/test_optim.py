"""Optimizers, gradient clipping and schedules: hand computations, invariants, PyTorch parity."""

import math

import numpy as np
import pytest

from tformer.training.optim import SGD, Adam, AdamW, LRScheduler, clip_grad_norm, cosine_with_warmup, noam_lr


class Params:
    """A stand-in model: ``named_parameters()`` over a dict of arrays and a dict of their grads."""

    def __init__(self, params):
        self.params = {k: np.array(v) for k, v in params.items()}
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}

    def named_parameters(self):
        for k in self.params:
            yield k, self.params[k], self.grads[k]

    def zero_grad(self):
        for g in self.grads.values():
            g.fill(0)

    def set_grads(self, grads):
        for k, g in grads.items():
            self.grads[k][...] = g


def make_model(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return Params({"layer.W": rng.standard_normal((3, 4)).astype(dtype),
                   "layer.b": rng.standard_normal(4).astype(dtype),
                   "emb": rng.standard_normal((5, 2)).astype(dtype)})


def grad_sequence(model, n, seed=1, scale=1.0):
    rng = np.random.default_rng(seed)
    return [{k: scale * rng.standard_normal(p.shape) for k, p in model.params.items()}
            for _ in range(n)]


def run(opt, model, grads):
    for g in grads:
        model.set_grads(g)
        opt.step()


def snapshot(model):
    return {k: p.copy() for k, p in model.params.items()}


# ---------------------------------------------------------------- hand computations, one scalar

def test_adam_scalar_by_hand():
    # θ0 = 0.5, g1 = 0.1, g2 = -0.2, lr = 0.01, β = (0.9, 0.999), ε = 1e-8, written out in floats
    model = Params({"w": np.array([0.5])})
    opt = Adam(model, lr=0.01, betas=(0.9, 0.999), eps=1e-8)
    model.set_grads({"w": [0.1]})
    opt.step()
    m1 = 0.9 * 0.0 + 0.1 * 0.1                       # 0.01
    v1 = 0.999 * 0.0 + 0.001 * 0.1 ** 2              # 1e-5
    m_hat1 = m1 / (1 - 0.9)                          # 0.1
    v_hat1 = v1 / (1 - 0.999)                        # 0.01
    th1 = 0.5 - 0.01 * m_hat1 / (math.sqrt(v_hat1) + 1e-8)
    assert model.params["w"][0] == pytest.approx(th1, rel=1e-14)
    assert th1 == pytest.approx(0.49, rel=1e-6)      # first Adam step moves by ≈ lr·sign(g)
    model.set_grads({"w": [-0.2]})
    opt.step()
    m2 = 0.9 * m1 + 0.1 * -0.2
    v2 = 0.999 * v1 + 0.001 * 0.04
    m_hat2 = m2 / (1 - 0.9 ** 2)
    v_hat2 = v2 / (1 - 0.999 ** 2)
    th2 = th1 - 0.01 * m_hat2 / (math.sqrt(v_hat2) + 1e-8)
    assert model.params["w"][0] == pytest.approx(th2, rel=1e-14)
    assert opt.state["w"]["m"][0] == pytest.approx(m2, rel=1e-14)
    assert opt.state["w"]["v"][0] == pytest.approx(v2, rel=1e-14)
    assert opt.t == 2


def test_adamw_scalar_both_forms_by_hand():
    lr, lam, eps = 0.1, 0.5, 1e-8
    for inside in (True, False):
        model = Params({"w": np.array([2.0])})
        opt = AdamW(model, lr=lr, betas=(0.9, 0.99), eps=eps, weight_decay=lam,
                    eps_inside_sqrt=inside)
        th, m, v = 2.0, 0.0, 0.0
        for t, g in enumerate([0.3, -0.1, 0.05], start=1):
            model.set_grads({"w": [g]})
            opt.step()
            m = 0.9 * m + 0.1 * g
            v = 0.99 * v + 0.01 * g * g
            m_hat, v_hat = m / (1 - 0.9 ** t), v / (1 - 0.99 ** t)
            if inside:   # the two-layer transformer's form: W = (1 − λη)W − η·(m/(1−β1^t)) / sqrt(v/(1−β2^t) + ε)
                th = (1 - lam * lr) * th - lr * m_hat / math.sqrt(v_hat + eps)
            else:        # TinyGPT's form: θ ← θ − α(m̂/(√v̂+ε) + λθ)
                th = th - lr * (m_hat / (math.sqrt(v_hat) + eps) + lam * th)
            assert model.params["w"][0] == pytest.approx(th, rel=1e-14, abs=1e-15)


# ---------------------------------------------------------------- hand computations, arrays

def test_sgd_plain_two_steps_by_hand():
    model = make_model()
    th = snapshot(model)
    grads = grad_sequence(model, 2)
    opt = SGD(model, lr=0.1)
    run(opt, model, grads)
    for k in th:
        expected = th[k] - 0.1 * grads[0][k] - 0.1 * grads[1][k]
        np.testing.assert_allclose(model.params[k], expected, rtol=1e-14, atol=1e-15)
    assert opt.t == 2


def test_sgd_momentum_weight_decay_three_steps_by_hand():
    model = make_model()
    th = snapshot(model)
    grads = grad_sequence(model, 3)
    lr, mu, lam = 0.05, 0.9, 0.01
    opt = SGD(model, lr=lr, momentum=mu, weight_decay=lam)
    run(opt, model, grads)
    for k in th:
        theta, b = th[k], np.zeros_like(th[k])
        for g in grads:
            g_eff = g[k] + lam * theta          # g ← ∇ + λθ
            b = mu * b + g_eff                  # b ← μb + g
            theta = theta - lr * b              # θ ← θ − ηb
        np.testing.assert_allclose(model.params[k], theta, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(opt.state[k]["momentum_buffer"], b, rtol=1e-13, atol=1e-15)


def _adam_reference(theta, grads, lr, b1, b2, eps, lam=0.0, form="adam"):
    m, v = np.zeros_like(theta), np.zeros_like(theta)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g ** 2
        m_hat = m / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** t)
        if form == "adam":
            theta = theta - lr * m_hat / (np.sqrt(v_hat) + eps)
        elif form == "inside":
            theta = (1 - lam * lr) * theta - lr * m_hat / np.sqrt(v_hat + eps)
        else:
            theta = theta - lr * (m_hat / (np.sqrt(v_hat) + eps) + lam * theta)
    return theta, m, v


@pytest.mark.parametrize("form", ["adam", "inside", "outside"])
def test_adam_family_three_steps_by_hand(form):
    model = make_model()
    th = snapshot(model)
    grads = grad_sequence(model, 3)
    lr, b1, b2, eps, lam = 1e-2, 0.8, 0.95, 1e-6, 0.1
    if form == "adam":
        opt = Adam(model, lr=lr, betas=(b1, b2), eps=eps)
    else:
        opt = AdamW(model, lr=lr, betas=(b1, b2), eps=eps, weight_decay=lam,
                    eps_inside_sqrt=(form == "inside"))
    run(opt, model, grads)
    for k in th:
        theta, m, v = _adam_reference(th[k], [g[k] for g in grads], lr, b1, b2, eps, lam, form)
        np.testing.assert_allclose(model.params[k], theta, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(opt.state[k]["m"], m, rtol=1e-13, atol=1e-16)
        np.testing.assert_allclose(opt.state[k]["v"], v, rtol=1e-13, atol=1e-16)


def test_one_adamw_step_by_hand_on_matrices():
    """W ← (1 − λη) W − η · m̂ / √(v̂ + ε); at t = 1, m̂ = g and v̂ = g²."""
    lr, wd, eps = 0.1, 0.01, 0.01                  # ε this large so that its placement shows
    values = {"W_q": [[0.5, -0.25], [1.0, 0.0]], "W_k": [[0.1, 0.2], [0.3, 0.4]],
              "W_v": [[1.0, 0.0], [0.0, 1.0]], "W_o": [[-0.5, 0.5], [0.25, 2.0]]}
    grads = {"W_q": [[0.2, 0.0], [-0.3, 1.0]], "W_k": [[0.0, 0.1], [0.0, 0.0]],
             "W_v": [[-2.0, 0.5], [0.05, 0.0]], "W_o": [[0.3, -0.1], [0.0, 0.7]]}
    model = Params(values)                         # the single attention layer's four matrices
    model.set_grads(grads)
    P = model.params
    assert all(P[sym].dtype == np.float64 for sym in values)
    opt = AdamW(model, lr=lr, betas=(0.9, 0.999), eps=eps, weight_decay=wd, eps_inside_sqrt=True)
    opt.step()
    # one entry with numbers: W = 0.5, g = 0.2: 0.5·(1 − 0.001) − 0.1 · 0.2 / √(0.04 + 0.01)
    assert abs(P["W_q"][0, 0] - (0.4995 - 0.02 / math.sqrt(0.05))) < 1e-15
    assert abs(P["W_q"][0, 0] - 0.41005728) < 1e-8
    # a zero gradient only decays: W = −0.25 → −0.25 · 0.999
    assert abs(P["W_q"][0, 1] - (-0.24975)) < 1e-15
    for sym in values:
        W0, g = np.array(values[sym]), np.array(grads[sym])
        m_hat = (1 - 0.9) * g / (1 - 0.9)
        v_hat = (1 - 0.999) * g * g / (1 - 0.999)
        expected = (1 - wd * lr) * W0 - lr * m_hat / np.sqrt(v_hat + eps)
        assert np.abs(P[sym] - expected).max() < 1e-14, sym
    # the other placement (√v̂ + ε, TinyGPT's) gives a different step here
    outside = (1 - wd * lr) * 0.5 - lr * 0.2 / (math.sqrt(0.04) + eps)
    assert abs(P["W_q"][0, 0] - outside) > 1e-3


# ---------------------------------------------------------------- AdamW: the two forms, decoupling

def test_adamw_forms_differ_exactly_by_eps_placement():
    # One step from the same θ: both shrink θ by (1 − ηλ), so
    # θ_outside − θ_inside = η · m_hat · (1/√(v_hat+ε) − 1/(√v_hat+ε)).
    lr, lam, eps = 1e-3, 0.01, 1e-8
    g = np.array([1e-6, -3e-7, 2.0, -0.5])           # tiny and ordinary gradients
    out = {}
    for inside in (True, False):
        model = Params({"w": np.ones(4)})
        opt = AdamW(model, lr=lr, eps=eps, weight_decay=lam, eps_inside_sqrt=inside)
        model.set_grads({"w": g})
        opt.step()
        out[inside] = model.params["w"].copy()
    m_hat, v_hat = g, g * g                          # step 1: bias correction undoes (1−β)
    derived = lr * m_hat * (1 / np.sqrt(v_hat + eps) - 1 / (np.sqrt(v_hat) + eps))
    np.testing.assert_allclose(out[False] - out[True], derived, rtol=1e-8, atol=1e-18)
    step_outside, step_inside = 1.0 * (1 - lr * lam) - out[False], 1.0 * (1 - lr * lam) - out[True]
    # tiny v_hat: ε outside √ still moves ≈ η·sign(g); ε inside moves ≈ η·g/√ε, 100× less for g=1e-6
    assert abs(step_outside[0]) == pytest.approx(lr * 1e-6 / (1e-6 + 1e-8), rel=1e-6)
    assert abs(step_inside[0]) == pytest.approx(lr * 1e-6 / math.sqrt(1e-12 + 1e-8), rel=1e-6)
    assert abs(step_inside[0]) < 0.011 * abs(step_outside[0])
    # ordinary gradients (v_hat ≫ ε): the forms agree to ~ε/|g|
    np.testing.assert_allclose(out[False][2:], out[True][2:], rtol=1e-7)


def test_adamw_decay_is_decoupled_and_adam_has_none():
    grads = grad_sequence(make_model(), 3)
    ref = make_model()
    opt_ref = AdamW(ref, lr=1e-2, weight_decay=0.0)
    run(opt_ref, ref, grads)
    for inside in (True, False):
        model = make_model()
        opt = AdamW(model, lr=1e-2, weight_decay=0.3, eps_inside_sqrt=inside)
        for g in grads:
            model.set_grads(g)
            opt.step()
            for k in g:                                                   # grad untouched
                np.testing.assert_allclose(model.grads[k], g[k], rtol=0, atol=0)
        for k in model.params:   # the decay never reaches the moments
            np.testing.assert_allclose(opt.state[k]["m"], opt_ref.state[k]["m"], rtol=0, atol=0)
            np.testing.assert_allclose(opt.state[k]["v"], opt_ref.state[k]["v"], rtol=0, atol=0)
    # zero gradient: AdamW only shrinks, θ(1 − ηλ); Adam leaves θ alone
    for inside in (True, False):
        model = make_model()
        th = snapshot(model)
        AdamW(model, lr=0.1, weight_decay=0.2, eps_inside_sqrt=inside).step()
        for k in th:
            np.testing.assert_allclose(model.params[k], th[k] * (1 - 0.1 * 0.2), rtol=1e-15)
    model = make_model()
    th = snapshot(model)
    Adam(model, lr=0.1).step()
    for k in th:
        np.testing.assert_allclose(model.params[k], th[k], rtol=0, atol=0)


# ---------------------------------------------------------------- lr, state, validation, dtype

@pytest.mark.parametrize("make_opt", [
    lambda m: SGD(m, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda m: Adam(m, lr=0.1),
    lambda m: AdamW(m, lr=0.1, eps_inside_sqrt=True),
    lambda m: AdamW(m, lr=0.1, eps_inside_sqrt=False),
])
def test_lr_change_between_steps_takes_effect(make_opt):
    # Every update here is lr × (a direction that does not depend on lr), so from the same state
    # a step at lr 0.02 must move each parameter by exactly 0.2× the step at lr 0.1; at lr 0
    # nothing moves (the decay η·λ vanishes with η).
    grads = grad_sequence(make_model(), 3)
    a = make_model()
    opt = make_opt(a)
    run(opt, a, grads[:1])
    before = snapshot(a)
    opt.lr = 0.0
    run(opt, a, grads[1:2])
    for k in before:
        np.testing.assert_allclose(a.params[k], before[k], rtol=0, atol=0)
    sd, at_2 = opt.state_dict(), snapshot(a)
    b = Params(at_2)
    opt_b = make_opt(b)
    opt_b.load_state_dict(sd)
    opt.lr, opt_b.lr = 0.02, 0.1
    run(opt, a, grads[2:])
    run(opt_b, b, grads[2:])
    assert opt.t == opt_b.t == 3
    for k in at_2:
        delta_a, delta_b = a.params[k] - at_2[k], b.params[k] - at_2[k]
        assert np.all(np.abs(delta_b) > 0)
        np.testing.assert_allclose(delta_a, 0.2 * delta_b, rtol=1e-9, atol=1e-17)


@pytest.mark.parametrize("make_opt", [
    lambda m: SGD(m, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda m: SGD(m, lr=0.1),
    lambda m: Adam(m, lr=0.01, betas=(0.8, 0.9)),
    lambda m: AdamW(m, lr=0.01, weight_decay=0.1, eps_inside_sqrt=True),
    lambda m: AdamW(m, lr=0.01, weight_decay=0.1, eps_inside_sqrt=False),
])
@pytest.mark.parametrize("through_npz", [False, True])
def test_state_dict_round_trip_bit_for_bit(make_opt, through_npz, tmp_path):
    grads = grad_sequence(make_model(), 5)
    a = make_model()
    opt_a = make_opt(a)
    run(opt_a, a, grads[:2])
    sd = opt_a.state_dict()
    params_at_2 = snapshot(a)
    run(opt_a, a, grads[2:])
    # the state dict holds copies: stepping on did not change it
    for k, v in sd.items():
        if k.startswith("m."):
            assert not np.shares_memory(v, opt_a.state[k[2:]]["m"])
    if through_npz:
        np.savez(tmp_path / "opt.npz", **sd)
        with np.load(tmp_path / "opt.npz") as f:
            sd = {k: f[k] for k in f.files}
    b = Params(params_at_2)
    opt_b = make_opt(b)
    opt_b.lr = 123.0                      # restored from the state dict
    opt_b.load_state_dict(sd)
    assert opt_b.t == 2 and opt_b.lr == opt_a.lr
    run(opt_b, b, grads[2:])
    assert opt_b.t == opt_a.t == 5
    for k in a.params:
        np.testing.assert_allclose(b.params[k], a.params[k], rtol=0, atol=0)


def test_load_state_dict_mismatch_raises_naming_the_parameter():
    model = make_model()
    opt = AdamW(model)
    run(opt, model, grad_sequence(model, 1))
    good = opt.state_dict()
    bad = dict(good, **{"m.layer.W": np.zeros((4, 3))})
    with pytest.raises(ValueError, match=r"layer\.W.*\(4, 3\)"):
        opt.load_state_dict(bad)
    bad = {k: v for k, v in good.items() if k != "v.emb"}
    with pytest.raises(ValueError, match=r"missing keys \['v\.emb'\]"):
        opt.load_state_dict(bad)
    bad = dict(good, **{"m.extra": np.zeros(2)})
    with pytest.raises(ValueError, match=r"unexpected keys \['m\.extra'\]"):
        opt.load_state_dict(bad)
    with pytest.raises(ValueError, match="Adam"):
        Adam(make_model()).load_state_dict(good)
    with pytest.raises(ValueError, match="beta1"):
        opt.load_state_dict(dict(good, beta1=1.5))
    # a failed load changed nothing
    after = opt.state_dict()
    assert after["t"] == 1 and after["beta1"] == 0.9
    for k in good:
        if isinstance(good[k], np.ndarray):
            np.testing.assert_allclose(after[k], good[k], rtol=0, atol=0)


@pytest.mark.parametrize("make, name, value", [
    (lambda m: SGD(m, lr=-0.1), "lr", "-0.1"),
    (lambda m: SGD(m, lr=0.1, momentum=-0.5), "momentum", "-0.5"),
    (lambda m: SGD(m, lr=0.1, momentum=1.0), "momentum", "1.0"),
    (lambda m: SGD(m, lr=0.1, weight_decay=-1), "weight_decay", "-1"),
    (lambda m: Adam(m, lr=float("nan")), "lr", "nan"),
    (lambda m: Adam(m, betas=(1.0, 0.999)), "beta1", "1.0"),
    (lambda m: Adam(m, betas=(0.9, -0.1)), "beta2", "-0.1"),
    (lambda m: Adam(m, eps=0.0), "eps", "0.0"),
    (lambda m: AdamW(m, eps=-1e-8), "eps", "-1e-08"),
    (lambda m: AdamW(m, weight_decay=-0.01), "weight_decay", "-0.01"),
    (lambda m: AdamW(m, eps_inside_sqrt="yes"), "eps_inside_sqrt", "yes"),
    (lambda m: clip_grad_norm(m, 0.0), "max_norm", "0.0"),
])
def test_bad_hyperparameters_raise_naming_argument_and_value(make, name, value):
    with pytest.raises(ValueError, match=rf"{name}.*{value}"):
        make(make_model())
    opt = Adam(make_model())
    with pytest.raises(ValueError, match=r"lr.*-1"):
        opt.lr = -1.0
    assert opt.lr == pytest.approx(1e-3, rel=0)


@pytest.mark.parametrize("make_opt", [
    lambda m: SGD(m, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda m: Adam(m, lr=0.01),
    lambda m: AdamW(m, lr=0.01, eps_inside_sqrt=True),
    lambda m: AdamW(m, lr=0.01, eps_inside_sqrt=False),
])
def test_float32_stays_float32_and_updates_in_place(make_opt):
    m32, m64 = make_model(dtype=np.float32), make_model(dtype=np.float64)
    arrays = {k: p for k, p in m32.params.items()}
    opt32, opt64 = make_opt(m32), make_opt(m64)
    grads = grad_sequence(m32, 3)
    for g in grads:
        m32.set_grads(g)
        m64.set_grads(g)
        opt32.step()
        opt64.step()
    for k, p in m32.params.items():
        assert p is arrays[k] and p.dtype == np.float32
        for s in opt32.state[k].values():
            assert s.dtype == np.float32
        np.testing.assert_allclose(p, m64.params[k], rtol=1e-5, atol=1e-6)


def test_step_rejects_a_parameter_added_later():
    model = make_model()
    opt = SGD(model, lr=0.1)
    model.params["new"] = np.zeros(2)
    model.grads["new"] = np.zeros(2)
    model.grads["layer.W"][...] = 1.0
    before = snapshot(model)
    with pytest.raises(ValueError, match="'new'"):
        opt.step()
    assert opt.t == 0   # checked before anything changed
    for k in before:
        np.testing.assert_allclose(model.params[k], before[k], rtol=0, atol=0)


# ---------------------------------------------------------------- gradient clipping

def _global_norm(model):
    return math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in model.grads.values()))


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-6)])
def test_clip_grad_norm_clips_to_max_norm(dtype, rtol):
    model = make_model(dtype=dtype)
    model.set_grads(grad_sequence(model, 1, scale=3.0)[0])
    before = {k: g.copy() for k, g in model.grads.items()}
    expected = _global_norm(model)
    norm = clip_grad_norm(model, max_norm=1.0)
    assert norm == pytest.approx(expected, rel=rtol)
    assert _global_norm(model) == pytest.approx(1.0, rel=rtol)
    for k, g in model.grads.items():
        assert g.dtype == dtype
        np.testing.assert_allclose(g, before[k] / expected, rtol=10 * rtol)   # direction kept


def test_clip_grad_norm_does_not_scale_under_max_norm():
    model = make_model()
    model.set_grads(grad_sequence(model, 1, scale=0.01)[0])
    before = {k: g.copy() for k, g in model.grads.items()}
    norm = clip_grad_norm(model, max_norm=1.0)
    assert norm == pytest.approx(_global_norm(model), rel=1e-12) and norm < 1.0
    for k in before:
        np.testing.assert_allclose(model.grads[k], before[k], rtol=0, atol=0)


def test_clip_grad_norm_nonfinite_returns_norm_and_leaves_grads():
    model = make_model()
    model.set_grads(grad_sequence(model, 1)[0])
    model.grads["emb"][1, 0] = np.inf
    before = {k: g.copy() for k, g in model.grads.items()}
    assert math.isinf(clip_grad_norm(model, 1.0))
    for k in before:
        np.testing.assert_allclose(model.grads[k], before[k], rtol=0, atol=0)
    model.grads["emb"][1, 0] = np.nan
    assert math.isnan(clip_grad_norm(model, 1.0))
    with pytest.raises(FloatingPointError, match="emb"):
        clip_grad_norm(model, 1.0, error_if_nonfinite=True)
    assert np.isnan(model.grads["emb"][1, 0])


def test_clip_grad_norm_float32_sum_of_squares_overflow():
    model = Params({"w": np.zeros(4, dtype=np.float32)})
    model.grads["w"][...] = [3e25, -4e25, 0.0, 0.0]      # squares overflow float32 (max 3.4e38)
    norm = clip_grad_norm(model, max_norm=1.0)
    assert norm == pytest.approx(5e25, rel=1e-6)
    np.testing.assert_allclose(model.grads["w"], [0.6, -0.8, 0.0, 0.0], rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- schedules

def test_noam_matches_formula_and_peaks_at_warmup():
    d_model, warmup = 512, 4000
    for step in (1, 2, 100, 3999, 4000, 4001, 10_000, 100_000):
        expected = d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
        assert noam_lr(step, d_model, warmup) == pytest.approx(expected, rel=1e-15)
    steps = np.arange(1, 3 * warmup)
    lrs = np.array([noam_lr(int(s), d_model, warmup) for s in steps])
    assert steps[np.argmax(lrs)] == warmup
    assert lrs.max() == pytest.approx((d_model * warmup) ** -0.5, rel=1e-12)
    assert noam_lr(1, 1, warmup) == pytest.approx(warmup ** -1.5, rel=1e-15)  # the guide's lambda
    with pytest.raises(ValueError, match="step"):
        noam_lr(0, d_model, warmup)


def test_cosine_with_warmup_endpoints_and_shape():
    max_lr, min_lr, warmup, total = 3e-4, 3e-5, 100, 1000
    f = lambda s: cosine_with_warmup(s, max_lr, warmup, total, min_lr)  # noqa: E731
    assert f(0) == pytest.approx(0.0, abs=1e-15)
    assert f(1) == pytest.approx(max_lr / warmup, rel=1e-12)
    assert f(warmup) == pytest.approx(max_lr, rel=1e-12)
    assert f((warmup + total) // 2) == pytest.approx((max_lr + min_lr) / 2, rel=1e-12)
    assert f(total) == pytest.approx(min_lr, rel=1e-12)
    assert f(total + 50) == pytest.approx(min_lr, rel=1e-12)
    ramp = [f(s) for s in range(warmup + 1)]
    decay = [f(s) for s in range(warmup, total + 1)]
    assert np.all(np.diff(ramp) > 0) and np.all(np.diff(decay) < 0)
    s = 700
    expected = min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * (s - warmup) / (total - warmup)))
    assert f(s) == pytest.approx(expected, rel=1e-14)
    with pytest.raises(ValueError, match="total"):
        cosine_with_warmup(5, max_lr, 10, 10)


def test_trapezoid_rises_holds_and_falls_to_zero():
    from tformer.training.schedules import trapezoid
    max_lr, warmup, total, cooldown = 0.02, 10, 100, 40
    f = lambda s: trapezoid(s, max_lr, warmup, total, cooldown)  # noqa: E731
    assert f(0) == 0.0 and f(5) == pytest.approx(max_lr / 2, rel=1e-12)
    assert f(warmup) == f(total - cooldown) == max_lr
    assert f(total - cooldown // 2) == pytest.approx(max_lr / 2, rel=1e-12)
    assert f(total) == 0.0 and f(total + 7) == 0.0
    down = [f(s) for s in range(total - cooldown, total + 1)]
    assert np.allclose(np.diff(down), -max_lr / cooldown, rtol=1e-9, atol=0)   # a straight line
    assert trapezoid(1, 1.0, 0, 10, 10) == pytest.approx(0.9)          # no warm-up: from the peak
    for bad, match in (((5, 1.0, 10, 15, 6), "warmup \\+ cooldown"), ((5, -1.0, 0, 9, 3), "max_lr"),
                       ((5, 1.0, 0, 9, 0), "cooldown"), ((1.5, 1.0, 0, 9, 3), "step")):
        with pytest.raises((ValueError, TypeError), match=match):
            trapezoid(*bad)


def test_lr_scheduler_sets_each_steps_lr_in_either_call_order():
    fn = lambda s: noam_lr(s, 16, 4)  # noqa: E731
    seen = {}
    for order in ("before", "after"):
        model = Params({"w": np.zeros(1)})
        opt = SGD(model, lr=0.0)
        sched = LRScheduler(opt, fn)
        model.grads["w"][...] = -1.0           # θ grows by exactly the lr of each step
        lrs = []
        for _ in range(6):
            if order == "before":
                sched.step()
            lrs.append(opt.lr)
            opt.step()
            if order == "after":
                sched.step()
        seen[order] = model.params["w"][0]
        np.testing.assert_allclose(lrs, [fn(s) for s in range(1, 7)], rtol=1e-15)
    assert seen["before"] == pytest.approx(sum(fn(s) for s in range(1, 7)), rel=1e-14)
    assert seen["after"] == pytest.approx(seen["before"], rel=1e-15)


# ---------------------------------------------------------------- PyTorch parity (float64)

def _torch_run(torch_opt_cls, kwargs, model, grads):
    torch = pytest.importorskip("torch")
    tparams = {k: torch.tensor(p.copy(), dtype=torch.float64, requires_grad=True)
               for k, p in model.params.items()}
    topt = torch_opt_cls(list(tparams.values()), **kwargs)
    for g in grads:
        for k, p in tparams.items():
            p.grad = torch.tensor(g[k], dtype=torch.float64)
        topt.step()
    return {k: p.detach().numpy() for k, p in tparams.items()}


@pytest.mark.torch_parity
@pytest.mark.parametrize("ours, theirs, kwargs", [
    (Adam, "Adam", dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8)),
    (AdamW, "AdamW", dict(lr=1e-2, betas=(0.85, 0.995), eps=1e-7, weight_decay=0.1)),
    (SGD, "SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
])
def test_parity_with_torch_five_steps(ours, theirs, kwargs):
    torch = pytest.importorskip("torch")
    model = make_model()
    grads = grad_sequence(model, 5)
    expected = _torch_run(getattr(torch.optim, theirs), kwargs, model, grads)
    extra = dict(eps_inside_sqrt=False) if ours is AdamW else {}
    opt = ours(model, **kwargs, **extra)
    run(opt, model, grads)
    for k in expected:
        np.testing.assert_allclose(model.params[k], expected[k], rtol=1e-12, atol=1e-14)


@pytest.mark.torch_parity
def test_eps_inside_sqrt_is_not_torch_adamw():
    torch = pytest.importorskip("torch")
    model = make_model()
    grads = grad_sequence(model, 3, scale=1e-5)      # v_hat ~ 1e-10: ε = 1e-8 under the root matters
    kwargs = dict(lr=1e-2, eps=1e-8, weight_decay=0.1)
    expected = _torch_run(torch.optim.AdamW, kwargs, model, grads)
    run(AdamW(model, eps_inside_sqrt=True, **kwargs), model, grads)
    diff = max(float(np.max(np.abs(model.params[k] - expected[k]))) for k in expected)
    assert diff > 1e-3


@pytest.mark.torch_parity
def test_clip_grad_norm_parity_with_torch():
    torch = pytest.importorskip("torch")
    model = make_model()
    model.set_grads(grad_sequence(model, 1, scale=2.0)[0])
    tparams = []
    for k, g in model.grads.items():
        p = torch.zeros(g.shape, dtype=torch.float64, requires_grad=True)
        p.grad = torch.tensor(g.copy())
        tparams.append(p)
    tnorm = float(torch.nn.utils.clip_grad_norm_(tparams, max_norm=1.5))
    norm = clip_grad_norm(model, max_norm=1.5)
    assert norm == pytest.approx(tnorm, rel=1e-12)
    for p, g in zip(tparams, model.grads.values()):   # torch divides by (norm + 1e-6)
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-5)


@pytest.mark.parametrize("make_opt", [
    lambda m: SGD(m, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda m: Adam(m, lr=0.01),
    lambda m: AdamW(m, lr=0.01, eps_inside_sqrt=True),
    lambda m: AdamW(m, lr=0.01, eps_inside_sqrt=False),
    lambda m: clip_grad_norm,
])
def test_no_float64_temporaries_on_float32(make_opt):
    # A step on a 1M-element float32 parameter allocates at most two float32 temporaries (8 MB);
    # a single float64 temporary of that size would already take 8 MB on its own plus the rest.
    import tracemalloc
    n = 1 << 20
    model = Params({"w": np.ones(n, dtype=np.float32)})
    model.grads["w"][...] = 1e-3
    opt = make_opt(model)
    step = (lambda: opt(model, 1e-6)) if opt is clip_grad_norm else opt.step
    step()                                            # warm up (lazy imports, caches)
    tracemalloc.start()
    try:
        step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    limit = 2 * 4 * n + (1 << 16) if opt is not clip_grad_norm else (1 << 16)
    assert peak <= limit, f"peak {peak} bytes > {limit}"
    assert model.params["w"].dtype == np.float32


def test_tied_array_is_updated_once_and_duplicate_names_raise():
    class Tied(Params):
        def named_parameters(self):
            yield "emb.W", self.params["W"], self.grads["W"]
            yield "head.W", self.params["W"], self.grads["W"]   # the same array, tied

    model = Tied({"W": np.ones(3)})
    model.grads["W"][...] = 2.0
    opt = SGD(model, lr=0.1)
    opt.step()
    np.testing.assert_allclose(model.params["W"], 1.0 - 0.1 * 2.0, rtol=1e-15)
    assert list(opt.state) == ["emb.W"]
    assert clip_grad_norm(model, 100.0) == pytest.approx(math.sqrt(3 * 4.0), rel=1e-15)

    class Dup(Params):
        def named_parameters(self):
            yield "a", self.params["a"], self.grads["a"]
            yield "a", self.params["b"], self.grads["b"]

    with pytest.raises(ValueError, match="'a' appears twice"):
        SGD(Dup({"a": np.ones(2), "b": np.ones(2)}), lr=0.1)
